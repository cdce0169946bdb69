"""Which of several equivalent kernels runs at a shape, chosen by timing them on this host at the shape's first
measured use, and kept for the process's life.

model/packed_linear.py asks it which matrix product a float32 linear layer runs for (rows, in, out): the fastest
one depends on the host's read rate, its cores and its caches, which no fixed rule tuned on one machine gets right
everywhere (issue 50: on one slow 2-core host ONNX Runtime's skinny products kept up from 1 to 4 rows where
oneDNN's fell behind; `python -m bench.experiments generate_speed`, bench/results/generate_speed.json).  Each candidate is timed in turns with the others (the order reversed every other round, after one untimed
warm-up round: a first call builds kernels and allocates), and the fastest round of each counts: on a shared host
another program's bursts only ever slow a round down.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

log = logging.getLogger(__name__)

ROUNDS = 3  # timed rounds per candidate, after the warm-up one


class KernelChoices:
    """The kernel chosen per shape (`choose`), and each measured shape's timings (`timings`): the fastest round
    of each candidate, in seconds.  `clock`: seconds, as time.perf_counter (a test passes a fake one)."""

    def __init__(self, clock=time.perf_counter, rounds: int = ROUNDS):
        self.clock, self.rounds = clock, rounds
        self.chosen: dict[tuple, str] = {}
        self.timings: dict[tuple, dict[str, float]] = {}

    def choose(self, shape: tuple, candidates: Callable[[], dict[str, Callable[[], object]]]) -> str:
        """The kernel for `shape`: the one chosen already, or the fastest of `candidates()` (name -> a call that
        runs that kernel once at this shape), timed now."""
        chosen = self.chosen.get(shape)
        if chosen is None:
            runs = candidates()
            if not runs:
                raise ValueError(f"no kernel candidates for shape {shape}")
            best = self.timings[shape] = self._time(runs)
            chosen = self.chosen[shape] = min(best, key=best.get)
            log.info("kernel for %s: %s (%s)", shape, chosen,
                     ", ".join(f"{name} {seconds * 1e3:.3f} ms" for name, seconds in best.items()))
        return chosen

    def _time(self, runs: dict[str, Callable[[], object]]) -> dict[str, float]:
        names = list(runs)
        for name in names:  # the warm-up round
            runs[name]()
        best = {name: float("inf") for name in names}
        for round_ in range(self.rounds):
            for name in names[::-1] if round_ % 2 else names:
                start = self.clock()
                runs[name]()
                best[name] = min(best[name], self.clock() - start)
        return best
