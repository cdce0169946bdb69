"""decode/trace_payback.py: the default decode traces a call's steps exactly when the tokens it has left repay the
trace, as the process's own timings of the last seconds say, runs a trace once made, and learns and keeps for
later processes only what it timed on a quiet host; a fake clock makes every eager step, trace and traced step take
a set time, so the repay point is known to the token, and a scripted host is quiet or busy when the test says."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import decode.trace
import decode.trace_payback
from decode.generate import CallTiming, generate
from decode.sampling import SamplingParams
from decode.trace import _RECORDS, TracedSteps
from decode.kept_ratios import KeptRatios
from decode.trace_payback import KEEP_AFTER_TRACED_STEPS, PRIOR_TRACE_STEPS, PRIOR_TRACED_SHARE, WINDOW_S, TracePayback
from model.packed_linear import pack_for_inference
from tests.conftest import small_config
from tests.scripted_host import ScriptedHost

EAGER_S, TRACE_S, TRACED_S = 0.010, 0.200, 0.005


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.eager_s = EAGER_S  # what an eager pass takes under the `timed` fixture
        self.traced_steps = 0  # the traced steps it has run

    def __call__(self) -> float:
        return self.now


def payback_on(host: ScriptedHost, kept: KeptRatios | None = None) -> TracePayback:
    """A fresh table timing on `host`'s clock, reading `host`'s load."""
    return TracePayback(clock=host.clock, kept=kept, load=host.load)


@pytest.fixture
def timed(small_model, monkeypatch):
    """The small model, packed, whose eager passes take EAGER_S, traces TRACE_S and traced steps TRACED_S on a
    fresh table's fake clock."""
    clock = FakeClock()
    host = ScriptedHost(clock)
    monkeypatch.setattr(decode.trace_payback, "PAYBACK", payback_on(host))
    tracing = []
    real_trace, real_call = decode.trace._trace, TracedSteps.__call__

    def trace(*args, **kwargs):
        tracing.append(True)
        try:
            return real_trace(*args, **kwargs)
        finally:
            tracing.pop()
            clock.now += TRACE_S

    def traced_step(self, *args, **kwargs):
        out = real_call(self, *args, **kwargs)
        clock.now += TRACED_S
        clock.traced_steps += 1
        return out

    def eager_pass(*_):
        if not tracing:  # the tracer's own run of the model is part of the trace's time
            clock.now += clock.eager_s

    monkeypatch.setattr(decode.trace, "_trace", trace)
    monkeypatch.setattr(TracedSteps, "__call__", traced_step)
    pack_for_inference(small_model)
    small_model.register_forward_hook(eager_pass)
    return small_model


def prompt(batch=2, length=5):
    return torch.randint(0, 50257, (batch, length), generator=torch.Generator().manual_seed(1))


def greedy(new_tokens):
    return SamplingParams(max_new_tokens=new_tokens, temperature=0, stop_at_eot=False)


def traces_of(model) -> int:
    return len(_RECORDS[model].traces) if model in _RECORDS else 0


def call(model, new_tokens, batch=2) -> CallTiming:
    timing = CallTiming()
    assert torch.equal(generate(model, prompt(batch), greedy(new_tokens), timing=timing),
                       generate(model, prompt(batch), greedy(new_tokens), decode="dynamic"))
    return timing


# Before any trace, the guess: a trace costs PRIOR_TRACE_STEPS eager steps and a traced step PRIOR_TRACED_SHARE of
# one.  The prompt's pass makes the first token; the first step after it is left out of the timings and the second
# timed, so the third decides, with new_tokens - 3 left: it traces when they save more than the trace costs.
REPAID_AFTER = PRIOR_TRACE_STEPS / (1 - PRIOR_TRACED_SHARE)  # 50 tokens left


@pytest.mark.parametrize("new_tokens, traced", [(int(REPAID_AFTER) + 2, False), (int(REPAID_AFTER) + 4, True)])
def test_a_call_traces_just_above_the_repay_point_and_not_just_below(timed, new_tokens, traced):
    timing = call(timed, new_tokens)
    assert traces_of(timed) == int(traced)
    assert (timing.setup_s > 0) == traced and timing.setup_before_first_token_s == 0


def test_short_calls_that_never_repay_a_trace_alone_trace_once_their_eager_steps_lost_what_it_costs(timed):
    # Guessed, a step saves (1 - PRIOR_TRACED_SHARE) x EAGER_S and the trace costs PRIOR_TRACE_STEPS eager steps: 50
    # steps repay it.  20-token calls run 19 steps each; at the third step of the third call 17 are left and 38 ran
    # in the two calls before (55 in all), at the second call's third step 17 and 19 (36).
    for calls, traces in ((2, 0), (1, 1)):
        for _ in range(calls):
            call(timed, 20)
        assert traces_of(timed) == traces


def test_the_first_trace_measured_sets_the_repay_point_of_the_next_shapes_and_a_kept_trace_is_free(timed):
    call(timed, int(REPAID_AFTER) + 4)  # traces batch 2: its trace (with its first step) and traced steps timed
    # Batch 3 and 4: the trace costs what batch 2's did (TRACE_S + TRACED_S), a traced step half an eager one as
    # at batch 2: repaid when (TRACE_S + TRACED_S) / (EAGER_S / 2) = 41 tokens are left at the third step.
    call(timed, 3 + 40, batch=3)
    assert traces_of(timed) == 1
    call(timed, 3 + 42, batch=4)
    assert traces_of(timed) == 2
    timing = call(timed, 12)  # short, at batch 2 again: its kept trace runs, at no cost
    assert timing.setup_s == 0 and traces_of(timed) == 2
    payback = decode.trace_payback.PAYBACK
    shape = (*next(iter(_RECORDS[timed].traces)), torch.get_num_threads())  # the trace's key and the threads it is for
    assert payback.traced_s(timed, shape) == pytest.approx(TRACED_S)


def test_a_kept_trace_runs_every_later_step_whatever_the_eager_steps_timed_and_the_first_eager_step_is_not_counted():
    host, model, shape = ScriptedHost(), torch.nn.Linear(1, 1), ("shape",)
    payback = payback_on(host)
    payback.note_eager(model, shape, 5.0)  # a first step: one-time work
    assert payback.estimates(model, shape) is None
    assert payback.traces(model, shape, 1000, kept=True)
    payback.note_eager(model, shape, 1.0)
    assert payback.estimates(model, shape) == (1.0, PRIOR_TRACED_SHARE, PRIOR_TRACE_STEPS)
    payback.note_trace(model, shape, 30.0)
    payback.note_traced(model, shape, 2.0)  # slower than the eager step (a busy spell, say): the trace still runs
    assert payback.traces(model, shape, 1000, kept=True)
    assert not payback.traces(model, shape, 10**9, kept=False)  # no gain: never repaid


def test_eager_steps_timed_longer_ago_than_the_window_are_forgotten_and_the_next_step_is_timed_first():
    host, model, shape = ScriptedHost(), torch.nn.Linear(1, 1), ("shape",)
    payback = payback_on(host)
    for _ in range(5):
        payback.note_eager(model, shape, 1.0)
        host.clock.now += 0.5
    assert payback.estimates(model, shape)[0] == pytest.approx(1.0)
    host.clock.now += WINDOW_S
    assert payback.estimates(model, shape) is None
    assert not payback.traces(model, shape, 10**6, kept=False)  # eager, timed afresh
    payback.note_eager(model, shape, 0.25)
    assert payback.estimates(model, shape)[0] == pytest.approx(0.25)


def quiet_trace(payback: TracePayback, model, shape, host: ScriptedHost, eager_s: float, trace_s: float,
                traced_s: float, traced_steps: int = KEEP_AFTER_TRACED_STEPS) -> None:
    """Eager steps of `eager_s`, a trace of `trace_s` and `traced_steps` traced steps of `traced_s`, on `host`'s
    clock, each timed as the host is at the time."""
    for _ in range(3):
        host.clock.now += eager_s
        payback.note_eager(model, shape, eager_s)
    mark = host.load.mark()
    host.clock.now += trace_s
    payback.note_trace(model, shape, trace_s, host.load.quiet_since(mark))
    for _ in range(traced_steps):
        host.clock.now += traced_s
        payback.note_traced(model, shape, traced_s)


def test_quiet_then_busy_then_quiet_learns_and_keeps_the_quiet_traces_alone(tmp_path):
    host, model = ScriptedHost(), torch.nn.Linear(1, 1)
    model.config = small_config()  # what a kept entry's step kind names
    path = tmp_path / "timings.json"
    payback = payback_on(host, KeptRatios(path))
    quiet_trace(payback, model, ("quiet",), host, 0.010, 0.200, 0.005)  # 20 eager steps, half an eager step
    [kept] = json.loads(path.read_text()).values()
    assert kept == pytest.approx([20.0, 0.5])
    host.others = 1.0  # a busy core: the trace costs 5 eager steps, a traced step is 0.9 of one
    host.clock.now += 1.0
    quiet_trace(payback, model, ("busy",), host, 0.040, 0.200, 0.036)
    assert len(json.loads(path.read_text())) == 1  # nothing timed under load is kept
    host.others = 0.0  # quiet again: a new shape is judged on the quiet trace's shares, not the busy one's
    host.clock.now += 1.0
    for _ in range(3):
        payback.note_eager(model, ("next",), 0.010)
    assert payback.estimates(model, ("next",)) == pytest.approx((0.010, 0.005, 0.200))
    # and a fresh process reads them: the busy spell's shares reached no one
    fresh = payback_on(host, KeptRatios(path))
    for _ in range(3):
        fresh.note_eager(model, ("quiet",), 0.010)
    assert fresh.estimates(model, ("quiet",)) == pytest.approx((0.010, 0.005, 0.200))


# A trace kept from an earlier process: with the fake clock the call that makes a trace takes TRACE_S and a traced
# step, a traced step half an eager one.  Kept, they repay a trace when (TRACE_S + TRACED_S) / (EAGER_S / 2) = 41 tokens
# are left at the third step; the guess (PRIOR_) asks for 50.
KEPT_TRACE_STEPS, KEPT_TRACED_SHARE = (TRACE_S + TRACED_S) / EAGER_S, TRACED_S / EAGER_S
BETWEEN = 3 + 45  # a call with 45 tokens left after its third step: repaid as kept, not as guessed


def fresh_process(timed_model, path: Path | None):
    """A new table, as a new process starts with, reading `path` (None: keeping nothing); no trace kept."""
    _RECORDS.pop(timed_model, None)
    old = decode.trace_payback.PAYBACK
    decode.trace_payback.PAYBACK = TracePayback(clock=old.clock, kept=KeptRatios(path) if path else None,
                                                load=old.load)


def test_a_process_keeps_what_its_trace_cost_and_the_next_decides_from_it(timed, tmp_path):
    path = tmp_path / "timings.json"
    fresh_process(timed, path)
    call(timed, int(REPAID_AFTER) + 4)  # traced at its third step, as guessed: repaid; its steps settle
    [(kind, ratios)] = json.loads(path.read_text()).items()
    assert ratios == pytest.approx([KEPT_TRACE_STEPS, KEPT_TRACED_SHARE])
    assert "torch" in kind and "PackedLinear" in kind  # what the step ran on, and through

    fresh_process(timed, None)  # guessing: 45 tokens left do not repay a trace
    call(timed, BETWEEN)
    assert traces_of(timed) == 0
    fresh_process(timed, path)  # this host's figures: they do
    call(timed, BETWEEN)
    assert traces_of(timed) == 1
