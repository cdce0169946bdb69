"""decode/step_threads.py: decode steps run with the thread count their own timings favour -- all threads on a
quiet machine, fewer when another program makes all of them slower -- and follow a load that comes and goes."""
from __future__ import annotations

import pytest
import torch

from decode import step_threads
from decode.step_threads import LONGEST_GAP, StepThreads, thread_counts


@pytest.fixture(autouse=True)
def caller_threads():
    """The choosers here set the process's thread count: each test gives the count back, pass or fail."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class FakeClock:
    """perf_counter for decode/step_threads.py, advanced by the steps: a step with n threads takes cost[n]."""

    def __init__(self, monkeypatch):
        self.now = 0.0
        monkeypatch.setattr(step_threads.time, "perf_counter", lambda: self.now)

    def steps(self, chooser: StepThreads, cost: dict[int, float], count: int, shape=(1, 1)) -> list[int]:
        used = []

        def step():
            threads = torch.get_num_threads()
            used.append(threads)
            self.now += cost[threads]
        for _ in range(count):
            chooser.run(shape, step)
        return used


def test_candidate_counts():
    assert thread_counts(1) == [1]
    assert thread_counts(2) == [2, 1]
    assert thread_counts(16) == [16, 15, 8, 1]


def test_a_quiet_machine_keeps_all_threads_and_a_busy_one_moves_to_fewer_and_back(monkeypatch):
    clock, chooser = FakeClock(monkeypatch), StepThreads(most=2)
    quiet, busy = {2: 0.010, 1: 0.016}, {2: 0.050, 1: 0.020}
    used = clock.steps(chooser, quiet, 1000)
    assert used.count(2) >= 0.97 * len(used)  # the tries grow rare: quiet speed is kept
    assert torch.get_num_threads() == 2
    used = clock.steps(chooser, busy, 100)
    assert used[10:].count(1) >= 0.9 * len(used[10:])  # within a few steps of the load
    # Between steps the chosen count stays set (an idle thread woken there took a core's share from the next step),
    # until the caller takes its own count back.
    assert torch.get_num_threads() == 1
    chooser.release()
    assert torch.get_num_threads() == 2
    used = clock.steps(chooser, quiet, 2 * LONGEST_GAP + 50)
    assert used[-50:].count(2) >= 48  # back on all threads once a try finds them faster again


def test_a_call_on_a_busy_machine_spends_few_steps_on_the_slow_count(monkeypatch):
    # A busy machine's all-thread steps cost ten one-thread ones: the first try comes within a few steps, and the
    # tries that confirm the choice after it grow rare enough to cost a small share of the call.
    clock, chooser = FakeClock(monkeypatch), StepThreads(most=2)
    busy = {2: 0.5, 1: 0.05}
    used = clock.steps(chooser, busy, 128)
    assert used[:4] == [2, 2, 1, 1]  # two steps on all threads (the first untimed), then the try, timed at its second
    assert used.count(2) <= 3
    assert clock.now <= 1.25 * 128 * busy[1]


def test_a_step_says_whether_it_is_a_try_while_it_runs(monkeypatch):
    clock, chooser = FakeClock(monkeypatch), StepThreads(most=2)
    seen = []

    def step():
        seen.append((torch.get_num_threads(), chooser.trying))
        clock.now += 1.0
    for _ in range(4):
        chooser.run((1, 1), step)
    assert seen == [(2, False), (2, False), (1, True), (1, True)]  # a count's first step tells nothing: tried again
    assert not chooser.trying


def test_each_shape_is_judged_on_its_own_steps(monkeypatch):
    clock, chooser = FakeClock(monkeypatch), StepThreads(most=2)
    clock.steps(chooser, {2: 0.01, 1: 0.02}, 200, shape=(12, 1))
    used = clock.steps(chooser, {2: 0.03, 1: 0.02}, 200, shape=(1, 1))
    assert used[20:].count(1) >= 0.9 * len(used[20:])
    assert chooser.shapes[12, 1].best(2) == 2 and chooser.shapes[1, 1].best(2) == 1


def test_generate_gives_its_caller_the_thread_count_back_whatever_its_steps_chose(monkeypatch, small_model):
    from decode import steps as decode_steps
    from decode.generate import generate
    from decode.sampling import SamplingParams
    from decode.step_threads import _Shape
    chooser = StepThreads(most=2)
    chooser.shapes[1, 1] = _Shape(mean_s={2: 1.0, 1: 0.1}, seen={2: 5, 1: 5}, next_try=10 ** 9)  # a busy machine's
    monkeypatch.setattr(decode_steps, "for_model", lambda model: chooser)
    used = []
    generate(small_model, torch.zeros(1, 4, dtype=torch.long),
             SamplingParams(max_new_tokens=6, temperature=0, stop_at_eot=False), decode="dynamic",
             on_token=lambda token: used.append(torch.get_num_threads()))
    assert used[1:] == [1] * 5  # between steps the steps' count, for the sampling too
    assert torch.get_num_threads() == 2 == chooser.most
