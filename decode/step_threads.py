"""How many CPU threads a decoding step runs with, chosen from the steps' own timings.

A decoding step is a chain of small parallel products, each ending at a barrier where every thread waits for
the slowest.  On a machine the process has to itself, all cores are fastest.  Beside another busy program (a
training job, a notebook, another service), the operating system deschedules one of the step's threads now and
then, and every product waits for it: measured on 2 cores with one kept busy by a Python loop, 2 threads decoded
slower than 1 (`python -m bench.experiments generate_speed`, its busy-core rows).  Which count is faster depends on
the load at the time, which changes while a server runs, so it is measured rather than guessed: the steps run
with the count whose recent steps were fastest, and now and then one step tries another count.  The first try comes
early (a busy machine's steps on all threads can take many times a one-thread step, so a call that waited long for its
first try would spend most of its time there); the tries then grow rarer while they keep confirming the choice, and
rarer still the more a try costs, so that tries take a small share of the steps' time: a quiet machine spends almost
every step on all its threads, a busy one almost none.

Steps are compared only with steps of the same model and shape (rows and new tokens per row), as each costs its
own; what a model's steps learnt is kept for the process's life (`for_model`), so that each generate() call does
not start over.

The chosen count stays set between steps, for the sampling and bookkeeping in between (and a server's next prompt):
a parallel operator there on all threads wakes the threads the step left idle, and OpenMP's idle threads spin a
while before they sleep, so beside a busy program they took a core's share from the next step's own thread.
`release` gives the caller its thread count back (generate() does at its end).
"""
from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass, field

import torch

EMA_WEIGHT = 0.3  # of the newest step in a count's running mean of step times
FIRST_TRY_AFTER = 2  # steps on the first choice before another count is tried (the first is not timed)
LONGEST_GAP = 256  # steps at most between tries, reached by doubling while the tries confirm the choice
TRIES_SHARE = 0.05  # of the chosen count's step time, what confirming tries may cost on average


def thread_counts(most: int) -> list[int]:
    """The counts worth trying with `most` threads: all, one core left to the other program, half, and one."""
    return sorted({most, max(1, most - 1), max(1, most // 2), 1}, reverse=True)


@dataclass
class _Shape:
    """Running step times, per thread count, of steps of one shape."""
    mean_s: dict[int, float] = field(default_factory=dict)
    seen: dict[int, int] = field(default_factory=dict)
    steps: int = 0
    gap: int = FIRST_TRY_AFTER
    next_try: int = FIRST_TRY_AFTER
    turn: int = 0  # which of the other counts the next try uses, in turn

    def best(self, default: int) -> int:
        return min(self.mean_s, key=self.mean_s.get) if self.mean_s else default


class StepThreads:
    """Runs each step with the fastest thread count seen lately for its shape (`run`)."""

    def __init__(self, most: int | None = None):
        self.most = most or torch.get_num_threads()
        self.counts = thread_counts(self.most)
        self.shapes: dict[tuple[int, int], _Shape] = {}
        # Whether the step running now is a try of another count: its time says nothing of the steps that will
        # follow (decode/trace_payback.py leaves it out).
        self.trying = False

    def run(self, shape: tuple[int, int], step):
        """`step()` with the count chosen for `shape`, timed to inform the next choices; the count the next steps
        will use stays set afterwards, until `release`."""
        if len(self.counts) == 1:
            return step()
        state = self.shapes.setdefault(shape, _Shape())
        best = state.best(self.most)
        trying = state.steps >= state.next_try
        count = best
        if trying:
            others = [c for c in self.counts if c != best]
            count = others[state.turn % len(others)]
        use_threads(count)
        self.trying = trying
        try:
            start = time.perf_counter()
            out = step()
            seconds = time.perf_counter() - start
        except BaseException:
            self.release()
            raise
        finally:
            self.trying = False
        seen = state.seen.get(count, 0)
        state.seen[count] = seen + 1
        if seen:  # a count's first step of a shape may carry one-time work (a trace, first allocations)
            # A try measures its count afresh (its last mean may date from another load); the chosen count's
            # steps follow the load as a running mean, so that a slower spell moves the choice within steps.
            old = state.mean_s.get(count, seconds)
            state.mean_s[count] = seconds if trying else (1 - EMA_WEIGHT) * old + EMA_WEIGHT * seconds
        state.steps += 1
        if trying:
            if not seen:
                state.next_try = state.steps  # that step told nothing yet: the same count again
            else:
                state.turn += 1
                # A try that confirms the choice makes the next one rarer, the more so the more it cost; one that
                # changes it, sooner.
                state.gap = (min(LONGEST_GAP, max(2 * state.gap, _gap_for(state.mean_s[count], state.mean_s[best])))
                             if state.best(self.most) == best else FIRST_TRY_AFTER)
                state.next_try = state.steps + state.gap
        use_threads(state.best(self.most))
        return out

    def release(self) -> None:
        """Give the caller its thread count back (the count these steps were made with)."""
        use_threads(self.most)


def _gap_for(tried_s: float, chosen_s: float) -> int:
    """Steps between tries for a try that costs `tried_s` - `chosen_s` more than a step to stay TRIES_SHARE of the
    steps' time."""
    return math.ceil(max(0.0, tried_s / chosen_s - 1) / TRIES_SHARE) if chosen_s > 0 else LONGEST_GAP


def use_threads(count: int) -> None:
    """Set torch's thread count to `count` (a call only when it differs: setting it is not free)."""
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)


_BY_MODEL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def for_model(model) -> StepThreads:
    """The StepThreads of `model`'s steps, made on first use and kept while the model lives."""
    chooser = _BY_MODEL.get(model)
    if chooser is None or chooser.most != torch.get_num_threads():  # the user changed the thread count since
        chooser = _BY_MODEL[model] = StepThreads()
    return chooser
