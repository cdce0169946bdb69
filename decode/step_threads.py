"""How many CPU threads a decoding step runs with: the cores other programs left free over the last quarter second.

A decoding step is a chain of small parallel products, each ending at a barrier where every thread waits for
the slowest.  On a machine the process has to itself, all cores are fastest.  Beside another busy program (a
training job, a notebook, another service), the operating system deschedules one of the step's threads now and
then, and every product waits for it: on 2 cores with one kept busy, 2 threads decoded slower than 1
(`python -m bench.experiments generate_speed`, its busy-core rows; `python -m bench.experiments user_start` sets
this rule against all threads at every step, through a busy spell).

The count is read from the host, not from past steps: each step runs with as many threads as other programs left
cores free over the last WINDOW_S (runtime/host_load.py), rounded, at least one and at most the process's count.
An earlier rule chose the count whose running mean of step times was lowest, trying the others ever more rarely;
steps timed while six processes warmed up together kept it on fewer threads long after the host was quiet
(issue 70).  The host's counters forget a load a quarter second after it ends, and reading them costs no step.

The chosen count stays set between steps, for the sampling and bookkeeping in between (and a server's next prompt):
a parallel operator there on all threads wakes the threads the step left idle, and OpenMP's idle threads spin a
while before they sleep, so beside a busy program they took a core's share from the next step's own thread.
`release` gives the caller its thread count back (generate() does at its end).
"""
from __future__ import annotations

import math

import torch

from runtime import host_load
from runtime.host_load import HostLoad


class StepThreads:
    """Runs each step with the threads the host's other programs leave free (`run`), out of `most` (default: the
    count set now), as `load` (default: the process's HostLoad) measures them."""

    def __init__(self, most: int | None = None, load: HostLoad | None = None):
        self.most = most or torch.get_num_threads()
        self.load = load

    def count(self) -> int:
        """The threads for the next step: the cores free over the last window, rounded, within 1..most."""
        load = self.load or host_load.HOST_LOAD
        return max(1, min(self.most, math.floor(load.free_cores() + 0.5)))

    def run(self, step):
        """`step()` with `count()` threads, which stay set afterwards, until `release`."""
        if self.most == 1:
            return step()
        use_threads(self.count())
        try:
            return step()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Give the caller its thread count back (the count these steps were made with)."""
        use_threads(self.most)


def use_threads(count: int) -> None:
    """Set torch's thread count to `count` (a call only when it differs: setting it is not free)."""
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
