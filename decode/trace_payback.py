"""Whether tracing a call's decode steps pays for itself, judged from this process's own timings on this host.

A trace (decode/trace.py) costs many eager steps once, and each traced step then saves part of an eager one; how
many of each depends on the host (a slow host measured a 1.3 s trace saving 26 ms a step, repaid after about 50
tokens).  So `auto` (decode/steps.py) times the steps it runs, per model and step shape, and traces a call's steps
when the tokens it has left will repay the trace:

    trace now  <=>  (tokens left + eager steps run in earlier calls) x (eager step - traced step) > the trace's cost

Every figure comes from this host, and from the last WINDOW_S seconds of it: the eager step is the mean of the
eager steps just run (the first of a shape is left out: it carries one-time work, first allocations and kernel
choices).  A step timed longer ago is forgotten, so a mean from a busy spell (six processes warming up together, a
test run beside a notebook) cannot hold a quiet host's decision (issue 70); with no eager step timed in the window,
the next step runs eagerly and is timed first.  The trace's cost and a traced step are taken as shares of that
eager step: those an earlier process measured for the same step kind (decode/kept_ratios.py), else those of this
process's last trace, else the PRIOR_ ratios below.  Shares are learnt, and kept for later processes once a shape's
traced steps have settled, only from a trace and steps timed while other programs left the cores free
(runtime/host_load.py).  The first trace of a model also packs its weights, so later ones cost less than its
share says: the guess errs towards eager steps.

A trace once made runs every later step of its shape: a traced step runs the eager step's very products with no
Python between them, and ran faster than the eager one in every row of the current code's `python -m bench.experiments
generate_speed` runs (bench/results/generate_speed.json, fewer_ops_ab/, kernel_choice_ab/, intel_xeon_after/: fp32
and int8, batch 1 to 12, on two hosts).  An earlier
rule ran the eager step again now and then and followed the faster running mean; a mean taken under load held the
slower way for hundreds of steps after the load ended (issue 70).  The table lives as long as the process (and
each model).
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import torch

from decode.kept_ratios import KeptRatios
from runtime import host_load
from runtime.host_load import HostLoad
from runtime.timing import cpu_model

# Step timings older than this are forgotten: the load on a shared host comes and goes within seconds.
WINDOW_S = 2.0
# The guesses before any trace has been timed in this process, in eager steps of the host at hand, from issue 50's
# slow 2-core host (GPT-2 124M, batch 1): a 1.3 s trace against 71 ms eager steps, traced steps at 0.59 of them.
# With them a call traces when more than 20 / (1 - 0.6) = 50 tokens are left.
PRIOR_TRACE_STEPS = 20.0
PRIOR_TRACED_SHARE = 0.6
# Traced steps of a shape timed before its ratios are kept for later processes: their mean has settled.
KEEP_AFTER_TRACED_STEPS = 16


@dataclass
class Timed:
    """One step's time, when it ended, and whether other programs left the cores free then."""
    at_s: float
    seconds: float
    quiet: bool


@dataclass
class ShapeTimings:
    """One model's step timings at one shape (rows, tokens per row, mask, placement, dtype), in seconds."""
    eager: list[Timed] = field(default_factory=list)  # eager steps within the window, the first ever left out
    eager_seen: int = 0
    traced: list[Timed] = field(default_factory=list)  # traced steps within the window, the trace's own call left out
    traced_seen: int = 0
    trace_s: float | None = None  # the call that made this shape's trace (the trace and its first step)
    eager_at_trace_s: float | None = None  # the eager steps' mean when the trace was made
    trace_quiet: bool = False  # whether the trace and the eager steps it was measured against were timed quietly
    kind: str | None = None  # what its ratios are kept by between processes (`step_kind`), once asked


def _recent(timed: list[Timed], now: float) -> list[Timed]:
    """`timed` without what ended more than WINDOW_S before `now` (dropped from the list too)."""
    while timed and timed[0].at_s < now - WINDOW_S:
        del timed[0]
    return timed


def _mean(timed: list[Timed]) -> float | None:
    return sum(t.seconds for t in timed) / len(timed) if timed else None


class TracePayback:
    """Step timings per model and shape, and the decision they give (`traces`).  `clock`: seconds, as
    time.perf_counter (a test passes a fake one); `guess`: (trace cost, traced step) in eager steps until a trace
    is timed; `load`: whether other programs left the cores free (runtime/host_load.py; a test passes a scripted
    one)."""

    def __init__(self, clock=time.perf_counter, guess: tuple[float, float] = (PRIOR_TRACE_STEPS, PRIOR_TRACED_SHARE),
                 kept: KeptRatios | None = None, load: HostLoad | None = None):
        """`kept`: the ratios earlier processes measured, read and added to (None: this process's alone)."""
        self.clock, self.kept, self._load = clock, kept, load
        self._models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {shape: ShapeTimings}
        # (trace cost, traced step) in eager steps: the guess, then those of the last shape timed all three ways,
        # for shapes not yet traced
        self._ratios = guess

    @property
    def load(self) -> HostLoad:
        return self._load or host_load.HOST_LOAD

    def timings(self, model, shape: tuple) -> ShapeTimings:
        return self._models.setdefault(model, {}).setdefault(shape, ShapeTimings())

    def eager_s(self, model, shape: tuple) -> float | None:
        """The mean of the eager steps at `shape` timed within the last WINDOW_S (None: none was)."""
        return _mean(_recent(self.timings(model, shape).eager, self.clock()))

    def traced_s(self, model, shape: tuple) -> float | None:
        """The mean of the traced steps at `shape` timed within the last WINDOW_S (None: none was)."""
        return _mean(_recent(self.timings(model, shape).traced, self.clock()))

    def note_eager(self, model, shape: tuple, seconds: float) -> None:
        t = self.timings(model, shape)
        t.eager_seen += 1
        if t.eager_seen > 1:
            t.eager.append(Timed(self.clock(), seconds, self.load.quiet()))

    def note_trace(self, model, shape: tuple, seconds: float, quiet: bool = True) -> None:
        """The call that made the trace took `seconds`; `quiet`: whether the host was quiet all through it."""
        t = self.timings(model, shape)
        eager = _recent(t.eager, self.clock())
        t.trace_s, t.eager_at_trace_s = seconds, _mean(eager)
        t.trace_quiet = quiet and all(e.quiet for e in eager)
        t.traced.clear()

    def note_traced(self, model, shape: tuple, seconds: float) -> None:
        t = self.timings(model, shape)
        t.traced_seen += 1
        t.traced.append(Timed(self.clock(), seconds, self.load.quiet()))
        traced = _mean(_recent(t.traced, self.clock()))
        if not (t.eager_at_trace_s and t.trace_s):
            return
        # Learnt, and kept for later processes, only what was timed while the host was quiet: a trace timed beside a
        # busy program costs more eager steps than it would alone, and would hold off the next first traces.
        if not (t.trace_quiet and all(s.quiet for s in t.traced)):
            return
        self._ratios = ratios = (t.trace_s / t.eager_at_trace_s, traced / t.eager_at_trace_s)
        if self.kept is not None and t.traced_seen == KEEP_AFTER_TRACED_STEPS:
            self.kept.put(self._kind(model, shape, t), ratios)

    def estimates(self, model, shape: tuple) -> tuple[float, float, float] | None:
        """(eager step, traced step, trace cost) in seconds at `shape`: the steps as timed in the last WINDOW_S, the
        others as shares of the eager step; None while no eager step of it has been timed in the window.  The
        trace's cost is always a share of the eager step now (as an earlier process measured it, else as this
        process's last quiet trace did, else the guess), never seconds timed at another time: a trace timed while the
        host was busy would otherwise hold off every later shape's."""
        t = self.timings(model, shape)
        eager = self.eager_s(model, shape)
        if eager is None:
            return None
        kept = None
        if self.kept is not None and t.trace_s is None:
            kept = self.kept.get(self._kind(model, shape, t))
        trace_steps, traced_share = kept or self._ratios
        traced = self.traced_s(model, shape)
        traced = traced if traced is not None else eager * traced_share
        return eager, traced, eager * trace_steps

    @staticmethod
    def _kind(model, shape: tuple, t: ShapeTimings) -> str:
        if t.kind is None:
            t.kind = step_kind(model, shape)
        return t.kind

    def traces(self, model, shape: tuple, tokens_left: int, kept: bool, earlier: int = 0) -> bool:
        """Whether the step at `shape`, with `tokens_left` steps to run (this one included), should run traced:
        `kept`, whether its trace is made already (it then runs); `earlier`, the eager steps run at `shape` before
        this call."""
        if kept:
            return True
        estimates = self.estimates(model, shape)
        if estimates is None:
            return False  # this eager step is timed first
        eager, traced, cost = estimates
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
    # (the last part: entries from before a busy host's timings were left out are measured again)
    return " | ".join([cpu_model(), f"torch {torch.__version__}", sizes, ",".join(layers), repr(shape),
                       "timed on a quiet host"])


# The process's table: every DecodeSteps of the process reads and feeds it, and the timings file, as the
# environment names it.
PAYBACK = TracePayback(kept=KeptRatios.from_environment())
