"""decode/trace_payback.py: the default decode traces a call's steps exactly when the tokens it has left repay the
trace, as the process's own timings say; a fake clock makes every eager step, trace and traced step take a set time,
so the repay point is known to the token."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import decode.step_threads
import decode.trace
import decode.trace_payback
from decode.generate import CallTiming, generate
from decode.sampling import SamplingParams
from decode.trace import _RECORDS, TracedSteps
from decode.kept_ratios import KeptRatios
from decode.trace_payback import (EMA_WEIGHT, OUTLIER_CAP, PRIOR_TRACE_STEPS, PRIOR_TRACED_SHARE, RETIME_AFTER_STEPS,
                                  RETIME_SHARE, TracePayback)
from model.kv_cache import KVCache
from model.packed_linear import pack_for_inference

EAGER_S, TRACE_S, TRACED_S = 0.010, 0.200, 0.005


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.eager_s = EAGER_S  # what an eager pass takes under the `timed` fixture
        self.traced_steps = 0  # the traced steps it has run

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def timed(small_model, monkeypatch):
    """The small model, packed, whose eager passes take EAGER_S, traces TRACE_S and traced steps TRACED_S on a
    fresh table's fake clock."""
    clock = FakeClock()
    monkeypatch.setattr(decode.trace_payback, "PAYBACK", TracePayback(clock=clock))
    # one thread count, so no step is a try of another, which the table leaves out (a test of its own below): each
    # repay point is then known to the step
    monkeypatch.setattr(decode.step_threads, "thread_counts", lambda most: [most])
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


def test_a_try_of_fewer_threads_is_not_counted_as_the_steps_it_judges(timed, monkeypatch):
    # decode/step_threads.py tries one thread now and then: here at the second step, 100 times slower.  Counted, it
    # would make the eager steps look that slow, and a trace's measured cost (kept for later processes as a share of
    # them) look small.
    clock, steps_run = decode.trace_payback.PAYBACK.clock, []

    def second_on_one_thread(self, shape, step):
        steps_run.append(shape)
        self.trying = len(steps_run) == 2
        torch.set_num_threads(1 if self.trying else self.most)
        try:
            return step()
        finally:
            self.trying = False
            torch.set_num_threads(self.most)

    monkeypatch.setattr(decode.step_threads.StepThreads, "run", second_on_one_thread)
    def slower_on_one_thread(*_):
        if torch.get_num_threads() < 2:
            clock.now += 99 * EAGER_S

    timed.register_forward_hook(slower_on_one_thread)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        call(timed, 20)
        shape = (*decode.trace.TracedSteps(timed).key_for(*_one_step(timed)), 2)
    finally:
        torch.set_num_threads(before)
    assert decode.trace_payback.PAYBACK.timings(timed, shape).eager_s == pytest.approx(EAGER_S)


def _one_step(model, batch=2):
    """A cache after a prompt of `batch` rows, and one token per row: the step whose timings call() notes."""
    cache = KVCache.allocate(model.config, batch, 8, "cpu")
    cache.advance(5)
    return cache, torch.zeros(batch, 1, dtype=torch.long)


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
    assert payback.timings(timed, shape).traced_s == pytest.approx(TRACED_S)


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


def run_kept(payback: TracePayback, model, shape, steps: int, eager_s: float, traced_s: float) -> list[bool]:
    """`steps` decisions at `shape`, whose trace is kept, each step then timed as taking what its way takes now."""
    ways = []
    for _ in range(steps):
        ways.append(payback.traces(model, shape, 1000, kept=True))
        (payback.note_traced if ways[-1] else payback.note_eager)(model, shape, traced_s if ways[-1] else eager_s)
    return ways


def test_a_kept_trace_is_left_once_the_eager_steps_it_was_chosen_over_have_become_faster():
    # The eager steps were timed at 10 (before the weights went onto huge pages, say), the trace's at 6; eager steps
    # now take 4.  Timed only when they run, they would keep their 10 for good.
    ways = run_kept(*traced_at(10.0, 6.0), 400, eager_s=4.0, traced_s=6.0)
    # The eager way runs again once the steps since it ran, at RETIME_SHARE of 6 each, cover its expected loss (10 -
    # 6): after 67 traced steps.
    first_eager = ways.index(False)
    assert first_eager == math.ceil((10.0 - 6.0) / (RETIME_SHARE * 6.0)) - 1
    # A few more of those bring its mean below the trace's; from then on eager steps run, and a traced one only as
    # often as its loss (6 - 4) is RETIME_SHARE of the eager steps' time since: once in 50.
    assert sum(ways[-200:]) <= math.ceil(200 * RETIME_SHARE * 4.0 / (6.0 - 4.0))


def traced_at(eager_s: float, traced_s: float) -> tuple[TracePayback, torch.nn.Module, tuple]:
    """A table whose shape has a trace, timed: eager steps at `eager_s` (after the first), traced ones at `traced_s`."""
    model, shape = torch.nn.Linear(1, 1), ("shape",)
    payback = TracePayback(clock=FakeClock())
    for seconds in (50.0, eager_s):
        payback.note_eager(model, shape, seconds)
    payback.note_trace(model, shape, 30.0)
    payback.note_traced(model, shape, traced_s)
    return payback, model, shape


def test_a_kept_trace_far_faster_than_eager_steps_loses_at_most_retime_share_of_its_time_to_timing_them_again():
    ways = run_kept(*traced_at(2.0, 1.0), 1000, eager_s=2.0, traced_s=1.0)
    eager_steps = ways.count(False)
    assert 0 < eager_steps  # timed again now and then
    assert eager_steps * (2.0 - 1.0) <= RETIME_SHARE * 1000 * 1.0  # what those cost against all-traced steps


def test_two_ways_equally_fast_time_the_other_no_more_often_than_every_retime_after_steps():
    ways = run_kept(*traced_at(1.0, 1.0), 100, eager_s=1.0, traced_s=1.0)
    other = [i for i, way in enumerate(ways) if way != ways[0]]
    assert other and all(b - a > RETIME_AFTER_STEPS for a, b in zip(other, other[1:]))


# A trace kept from an earlier process: with the fake clock the call that makes a trace takes TRACE_S and a traced
# step, a traced step half an eager one.  Kept, they repay a trace when (TRACE_S + TRACED_S) / (EAGER_S / 2) = 41 tokens
# are left at the third step; the guess (PRIOR_) asks for 50.
KEPT_TRACE_STEPS, KEPT_TRACED_SHARE = (TRACE_S + TRACED_S) / EAGER_S, TRACED_S / EAGER_S
BETWEEN = 3 + 45  # a call with 45 tokens left after its third step: repaid as kept, not as guessed


def fresh_process(timed_model, path: Path | None):
    """A new table, as a new process starts with, reading `path` (None: keeping nothing); no trace kept."""
    _RECORDS.pop(timed_model, None)
    clock = decode.trace_payback.PAYBACK.clock
    decode.trace_payback.PAYBACK = TracePayback(clock=clock, kept=KeptRatios(path) if path else None)


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


def test_generate_leaves_a_kept_trace_once_its_eager_steps_have_become_faster(timed):
    call(timed, int(REPAID_AFTER) + 4)  # traced at its third step: eager steps EAGER_S, traced ones TRACED_S
    clock = decode.trace_payback.PAYBACK.clock
    clock.eager_s = TRACED_S / 2  # the eager steps get faster than the traced ones (the weights on huge pages, say)
    longest = timed.config.block_size - prompt().shape[1]
    for _ in range(6):
        before = clock.traced_steps
        call(timed, longest)
    # By the last call its eager steps run, and a traced step only when it is due to be timed again: once its loss
    # (TRACED_S - TRACED_S / 2) is RETIME_SHARE of the eager steps' time since it ran, 100 of them.
    assert clock.traced_steps - before <= math.ceil(longest * RETIME_SHARE * clock.eager_s / (TRACED_S - clock.eager_s))


def test_one_step_slowed_by_another_program_does_not_turn_a_kept_trace_into_the_slower_way():
    payback, model, shape = traced_at(2.0, 1.0)
    payback.note_traced(model, shape, 100.0)  # one traced step far slower than its way's mean: a hiccup
    assert payback.timings(model, shape).traced_s == pytest.approx(1.0 + EMA_WEIGHT * (OUTLIER_CAP - 1) * 1.0)
    assert payback.traces(model, shape, 1000, kept=True)
    for _ in range(5):  # a way that stays slower is followed, OUTLIER_CAP at a time
        payback.note_traced(model, shape, 100.0)
    assert not payback.traces(model, shape, 1000, kept=True)


def test_the_thread_count_is_informed_by_each_way_s_steps_apart(timed, monkeypatch):
    # decode/step_threads.py times each step to choose its thread count: an eager step among traced ones would read
    # as a slow spell of the count the traced steps run with
    keys, real_run = [], decode.step_threads.StepThreads.run

    def recording(self, shape, step):
        keys.append(shape)
        return real_run(self, shape, step)

    monkeypatch.setattr(decode.step_threads.StepThreads, "run", recording)
    generate(timed, prompt(), greedy(int(REPAID_AFTER) + 4))  # eager steps, then traced ones from the third
    assert keys[:3] == [(2, 1, False), (2, 1, False), (2, 1, True)] and set(keys[2:]) == {(2, 1, True)}
