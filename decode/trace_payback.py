"""Whether tracing a call's decode steps pays for itself, judged from this process's own timings on this host.

A trace (decode/trace.py) costs many eager steps once, and each traced step then saves part of an eager one; how
many of each depends on the host (a slow host measured a 1.3 s trace saving 26 ms a step, repaid after about 50
tokens).  So `auto` (decode/steps.py) times the steps it runs, per model and step shape, and traces a call's steps
when the tokens it has left will repay the trace:

    trace now  <=>  (tokens left + eager steps run in earlier calls) x (eager step - traced step) > the trace's cost

Every figure comes from this host: the eager step from the steps just run (the first of a shape is left out: it
carries one-time work, first allocations and kernel choices; so is a step on which decode/step_threads.py tries
another thread count), the trace's cost from the last trace made of the
model (the first of a model also packs its weights, so later ones cost less: the guess errs towards eager steps),
the traced step from the traced steps run.  Before the process has traced a shape, the traced step and the trace's
cost are taken as shares of this host's eager step: those an earlier process measured for the same step kind
(decode/kept_ratios.py, which each process adds to once a shape's traced steps have settled), else another shape's
in this process, else the PRIOR_ ratios below; the first trace replaces them.  A trace kept from an earlier call
costs nothing more, and runs while its steps are the faster ones.  Once a shape has a trace, the way not taken runs
again now and then, so its time is not the one it had when it last ran: eager steps timed before the weights went
onto huge pages, or while the host was busy, would otherwise keep a trace that has become the slower way for good.
It runs again after as many steps as make its loss (the gap between the two means) RETIME_SHARE of their time, and
never sooner than RETIME_AFTER_STEPS.  The table lives as long as the process (and each model).
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import torch

from decode.kept_ratios import KeptRatios
from runtime.timing import cpu_model

EMA_WEIGHT = 0.3  # of the newest step in a running mean of step times: the load on a shared host drifts
# A step counts as at most this many times its way's running mean: one step slowed by another program would
# otherwise lift the mean past the other way's and run the slower way until both had been timed again.
OUTLIER_CAP = 1.5
# The guesses before any trace has been timed in this process, in eager steps of the host at hand, from issue 50's
# slow 2-core host (GPT-2 124M, batch 1): a 1.3 s trace against 71 ms eager steps, traced steps at 0.59 of them.
# With them a call traces when more than 20 / (1 - 0.6) = 50 tokens are left.
PRIOR_TRACE_STEPS = 20.0
PRIOR_TRACED_SHARE = 0.6
# Traced steps of a shape timed before its ratios are kept for later processes: their running mean has settled.
KEEP_AFTER_TRACED_STEPS = 16
# With a trace made, the way not taken runs once its expected loss is this share of the steps' time since it last
# ran (at most 1 step in RETIME_AFTER_STEPS): traced steps at half an eager step's time run an eager one every 100.
RETIME_SHARE = 0.01
RETIME_AFTER_STEPS = 8


@dataclass
class ShapeTimings:
    """One model's step timings at one shape (rows, tokens per row, mask, placement, dtype), in seconds."""
    eager_s: float | None = None  # running mean of eager steps, the first left out
    eager_seen: int = 0
    traced_s: float | None = None  # running mean of traced steps, the trace's own call left out
    traced_seen: int = 0
    trace_s: float | None = None  # the call that made this shape's trace (the trace and its first step)
    since_eager: int = 0  # traced steps timed since the last eager one
    since_traced: int = 0  # eager steps timed since the last traced one
    kind: str | None = None  # what its ratios are kept by between processes (`step_kind`), once asked


def _mean(old: float | None, seconds: float) -> float:
    return seconds if old is None else (1 - EMA_WEIGHT) * old + EMA_WEIGHT * min(seconds, OUTLIER_CAP * old)


class TracePayback:
    """Step timings per model and shape, and the decision they give (`traces`).  `clock`: seconds, as
    time.perf_counter (a test passes a fake one); `guess`: (trace cost, traced step) in eager steps until a trace
    is timed."""

    def __init__(self, clock=time.perf_counter, guess: tuple[float, float] = (PRIOR_TRACE_STEPS, PRIOR_TRACED_SHARE),
                 kept: KeptRatios | None = None):
        """`kept`: the ratios earlier processes measured, read and added to (None: this process's alone)."""
        self.clock, self.kept = clock, kept
        self._models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {shape: ShapeTimings}
        # (trace cost, traced step) in eager steps: the guess, then those of the last shape timed all three ways,
        # for shapes not yet traced
        self._ratios = guess

    def timings(self, model, shape: tuple) -> ShapeTimings:
        return self._models.setdefault(model, {}).setdefault(shape, ShapeTimings())

    def note_eager(self, model, shape: tuple, seconds: float) -> None:
        t = self.timings(model, shape)
        t.eager_seen += 1
        t.since_eager, t.since_traced = 0, t.since_traced + 1
        if t.eager_seen > 1:
            t.eager_s = _mean(t.eager_s, seconds)
            self._learn(t)

    def note_trace(self, model, shape: tuple, seconds: float) -> None:
        self.timings(model, shape).trace_s = seconds

    def note_traced(self, model, shape: tuple, seconds: float) -> None:
        t = self.timings(model, shape)
        t.traced_s = _mean(t.traced_s, seconds)
        t.traced_seen += 1
        t.since_traced, t.since_eager = 0, t.since_eager + 1
        self._learn(t)
        if self.kept is not None and t.traced_seen == KEEP_AFTER_TRACED_STEPS and t.eager_s and t.trace_s:
            self.kept.put(self._kind(model, shape, t), (t.trace_s / t.eager_s, t.traced_s / t.eager_s))

    def _learn(self, t: ShapeTimings) -> None:
        if t.eager_s and t.traced_s is not None and t.trace_s is not None:
            self._ratios = (t.trace_s / t.eager_s, t.traced_s / t.eager_s)

    def estimates(self, model, shape: tuple) -> tuple[float, float, float] | None:
        """(eager step, traced step, trace cost) in seconds at `shape`, measured or guessed; None while no eager
        step of it has been timed."""
        t = self.timings(model, shape)
        if t.eager_s is None:
            return None
        kept = None
        if self.kept is not None and (t.traced_s is None or t.trace_s is None):
            kept = self.kept.get(self._kind(model, shape, t))
        trace_steps, traced_share = kept or self._ratios
        traced = t.traced_s if t.traced_s is not None else t.eager_s * traced_share
        cost = t.trace_s
        # The trace's cost: as an earlier process measured it, else the model's latest trace of another shape, else
        # a guess.
        if cost is None:
            costs = [s.trace_s for s in self._models[model].values() if s.trace_s is not None]
            cost = costs[-1] if costs and kept is None else t.eager_s * trace_steps
        return t.eager_s, traced, cost

    @staticmethod
    def _kind(model, shape: tuple, t: ShapeTimings) -> str:
        if t.kind is None:
            t.kind = step_kind(model, shape)
        return t.kind

    def traces(self, model, shape: tuple, tokens_left: int, kept: bool, earlier: int = 0) -> bool:
        """Whether the step at `shape`, with `tokens_left` steps to run (this one included), should run traced:
        `kept`, whether its trace is made already; `earlier`, the eager steps run at `shape` before this call.
        With a trace kept, the faster way by the means, or the other when it is due to be timed again."""
        estimates = self.estimates(model, shape)
        if estimates is None:
            return kept  # a kept trace runs; else this eager step is timed first
        eager, traced, cost = estimates
        if kept:
            t = self.timings(model, shape)
            faster_traced = traced < eager
            waited = t.since_eager if faster_traced else t.since_traced
            retime = waited >= RETIME_AFTER_STEPS and waited * RETIME_SHARE * min(eager, traced) >= abs(eager - traced)
            return faster_traced != retime
        # A process that ran `earlier` eager steps at this shape in earlier calls is taken to run as many again
        # after this one: short calls, none repaying a trace alone, trace once the steps run without it have lost
        # about what it costs, so the process pays at most about twice what it would knowing its future (the
        # ski-rental rule).
        return (tokens_left + earlier) * (eager - traced) > cost


def step_kind(model, shape: tuple) -> str:
    """Everything a step's timings depend on, as one line: the CPU, torch, the model's sizes and layer types (float,
    packed, int8), and `shape` (the trace's key and the thread count)."""
    config = model.config
    layers = sorted({type(m).__name__ for m in model.modules() if not any(m.children())})
    sizes = f"{config.n_layer} layers x {config.n_embd} x {config.n_head} heads, vocab {config.vocab_size}"
    return " | ".join([cpu_model(), f"torch {torch.__version__}", sizes, ",".join(layers), repr(shape)])


# The process's table: every DecodeSteps of the process reads and feeds it, and the timings file, as the
# environment names it.
PAYBACK = TracePayback(kept=KeptRatios.from_environment())
