"""decode/trace_payback.py: the default decode traces a call's steps exactly when the tokens it has left repay the
trace, as the process's own timings say; a fake clock makes every eager step, trace and traced step take a set time,
so the repay point is known to the token."""
from __future__ import annotations

import pytest
import torch

import decode.trace
import decode.trace_payback
from decode.generate import CallTiming, generate
from decode.sampling import SamplingParams
from decode.trace import _TRACES, TracedSteps
from decode.trace_payback import PRIOR_TRACE_STEPS, PRIOR_TRACED_SHARE, TracePayback
from model.packed_linear import pack_for_inference

EAGER_S, TRACE_S, TRACED_S = 0.010, 0.200, 0.005


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def timed(small_model, monkeypatch):
    """The small model, packed, whose eager passes take EAGER_S, traces TRACE_S and traced steps TRACED_S on a
    fresh table's fake clock."""
    clock = FakeClock()
    monkeypatch.setattr(decode.trace_payback, "PAYBACK", TracePayback(clock=clock))
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
        return out

    def eager_pass(*_):
        if not tracing:  # the tracer's own run of the model is part of the trace's time
            clock.now += EAGER_S

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
    return len(_TRACES.get(model, (None, {}))[1])


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
    assert payback.timings(timed, next(iter(_TRACES[timed][1]))).traced_s == pytest.approx(TRACED_S)


def test_a_kept_trace_slower_than_the_eager_steps_is_left_unused_and_the_first_eager_step_is_not_counted():
    clock, model, shape = FakeClock(), torch.nn.Linear(1, 1), ("shape",)
    payback = TracePayback(clock=clock)
    payback.note_eager(model, shape, 5.0)  # a first step: one-time work
    assert payback.estimates(model, shape) is None
    assert payback.traces(model, shape, 1000, kept=True)  # a kept trace runs while nothing says otherwise
    payback.note_eager(model, shape, 1.0)
    assert payback.estimates(model, shape) == (1.0, PRIOR_TRACED_SHARE, PRIOR_TRACE_STEPS)
    payback.note_trace(model, shape, 30.0)
    payback.note_traced(model, shape, 2.0)
    assert not payback.traces(model, shape, 1000, kept=True)
    assert not payback.traces(model, shape, 10**9, kept=False)  # no gain: never repaid
