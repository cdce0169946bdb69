"""Which of several equivalent kernels runs at a shape, chosen by timing them on this host at the shape's first
measured use, and kept: for the process's life, and in a file for the processes after it.

model/packed_linear.py asks it which matrix product a float32 linear layer runs for (rows, in, out): the fastest
one depends on the host's read rate, its cores and its caches, which no fixed rule tuned on one machine gets right
everywhere (issue 50: on one slow 2-core host ONNX Runtime's skinny products kept up from 1 to 4 rows where
oneDNN's fell behind; `python -m bench.experiments generate_speed`, bench/results/generate_speed.json).  Each candidate is timed in turns with the others (the order reversed every other round, after one untimed
warm-up round: a first call builds kernels and allocates), and the fastest round of each counts: on a shared host
another program's bursts only ever slow a round down.

A product timed alone can win and still slow the step it runs in (the layout of its output, the threads' hand-over
between one product and the next), so the kernels timed for a step's shapes are then confirmed in the step itself
(`confirm`): the whole step, with them and with each shape's default kernel, in turns; the defaults stay unless the
step ran faster with the choices.

Timing the candidates is most of what a fresh process's first trace of a decode step costs (bench/by_hand.md,
"kernel choices kept between processes"), and that cost decides whether a one-off call traces at all
(decode/trace_payback.py), so each choice is also kept in a file (runtime/kept_file.py), keyed by the CPU, torch
and the shape (rows, in, out, bias, threads), and a later process on this host takes it from there untimed.  A
choice is written there only once the step has confirmed it or put the default in its place: a process stopped
between the two (a Ctrl-C during its first trace) leaves the shape to be timed again, not a kernel the step
never judged.

Timings taken while other programs used the cores (runtime/host_load.py: a quarter of a core or more over the
timing) say more about that load than about the kernels: the shapes so timed run their default kernel instead, and
nothing is kept for other processes, so that a choice made under load neither outlives the load in this process
nor reaches the next ones (issue 70).  The next trace of a new shape, or the next process, times them on a quiet
host.

    $GPT2_KERNEL_CHOICES   the file (default .cache/kernel_choices.json in the project); `off` keeps nothing

A kept name that is not one of the shape's candidates (a file from another version, or edited) is timed again
and replaced; delete the file to time every shape afresh (after moving the project to another host of the same
CPU model, say).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

import torch

from runtime import host_load
from runtime.host_load import HostLoad
from runtime.kept_file import CACHE_FOLDER, KeptFile, kept_path
from runtime.timing import cpu_model

log = logging.getLogger(__name__)

ROUNDS = 3  # timed rounds per candidate, after the warm-up one
CHOICES_ENV = "GPT2_KERNEL_CHOICES"
DEFAULT_CHOICES = CACHE_FOLDER / "kernel_choices.json"


def kept_choices(path: Path | None) -> KeptFile:
    """The kernel choices file at `path` (None: nothing kept); an entry is a kernel's name."""
    return KeptFile(path, "kernel choices", lambda value: isinstance(value, str), "kernel names", CHOICES_ENV)


def kept_choices_from_environment() -> KeptFile:
    """The file $GPT2_KERNEL_CHOICES names (nothing kept for `off`), else the project's default."""
    return kept_choices(kept_path(CHOICES_ENV, DEFAULT_CHOICES))


def host_key(shape: tuple) -> str:
    """Everything a kernel's timings depend on besides the shape: the CPU and torch; and how it was chosen, so
    that a choice made before choices were confirmed in a step (`confirm`), or before a busy host's were left out,
    is made again."""
    return f"{cpu_model()} | torch {torch.__version__} | {shape!r} | confirmed in a step on a quiet host"


class KernelChoices:
    """The kernel chosen per shape (`choose`), and each shape's timings when this process measured it (`timings`):
    the fastest round of each candidate, in seconds.  `clock`: seconds, as time.perf_counter (a test passes a fake
    one); `kept`: the file of earlier processes' choices, read and added to (None: this process alone); `load`:
    whether other programs left the cores free (default: the process's runtime/host_load.py)."""

    def __init__(self, clock=time.perf_counter, rounds: int = ROUNDS, kept: KeptFile | None = None,
                 load: HostLoad | None = None):
        self.clock, self.rounds, self.kept, self._load = clock, rounds, kept, load
        self.chosen: dict[tuple, str] = {}
        self.timings: dict[tuple, dict[str, float]] = {}
        self.unconfirmed: set[tuple] = set()  # shapes timed since the last `confirm`
        self.timed_busy: set[tuple] = set()  # of those, the shapes timed while other programs used the cores
        self.looked_up: set[tuple] = set()  # shapes whose kept entry `known` has read (found or not)

    def choose(self, shape: tuple, candidates: Callable[[], dict[str, Callable[[], object]]]) -> str:
        """The kernel for `shape`: the one chosen already, by this process or (kept) an earlier one, or the fastest
        of `candidates()` (name -> a call that runs that kernel once at this shape), timed now and kept for this
        process (the file keeps it once `confirm` has judged it)."""
        chosen = self.chosen.get(shape)
        if chosen is None:
            runs = candidates()
            if not runs:
                raise ValueError(f"no kernel candidates for shape {shape}")
            kept = self.known(shape, runs.__contains__)
            if kept is not None:
                log.info("kernel for %s: %s (kept in %s)", shape, kept, self.kept.path)
                return kept
            mark = self.load.mark()
            best = self.timings[shape] = self._time(runs)
            if not self.load.quiet_since(mark):
                self.timed_busy.add(shape)
            chosen = self.chosen[shape] = min(best, key=best.get)
            self.unconfirmed.add(shape)
            log.info("kernel for %s: %s (%s)", shape, chosen,
                     ", ".join(f"{name} {seconds * 1e3:.3f} ms" for name, seconds in best.items()))
        return chosen

    def known(self, shape: tuple, runnable: Callable[[str], bool]) -> str | None:
        """The kernel for `shape` without timing anything: this process's choice, else the one an earlier process
        kept (if `runnable` accepts it), else None: `choose` then times the candidates, and a product outside a
        trace's choosing (an eager decode step) runs its default rule.  Eager steps so run what the traces run on
        this host; the file is read once per shape."""
        chosen = self.chosen.get(shape)
        if chosen is None and self.kept is not None and shape not in self.looked_up:
            self.looked_up.add(shape)
            kept = self.kept.get(host_key(shape))
            if kept is not None and runnable(kept):
                chosen = self.chosen[shape] = kept
            elif kept is not None:
                log.info("the kept kernel %r is not a candidate for %s; it is timed again when a trace chooses",
                         kept, shape)
        return chosen

    def confirm(self, step: Callable[[], object], default: Callable[[tuple], str]) -> dict[tuple, str]:
        """Keep the kernels timed since the last call only if `step` (a whole decode step, which runs every product
        of their shapes) is faster with them than with each shape's `default` kernel, the two timed in turns as
        candidates are; else the defaults replace them.  Either way the kernels it settles on go into the kept
        file, unless any of the timings ran while other programs used the cores: then the defaults run and nothing
        is kept.  Returns the kernels of the shapes it judged."""
        shapes, self.unconfirmed = sorted(self.unconfirmed), set()
        busy, self.timed_busy = bool(self.timed_busy & set(shapes)), set()
        timed = {shape: self.chosen[shape] for shape in shapes}
        defaults = {shape: default(shape) for shape in shapes}
        if busy:
            return self._defaults_unkept(defaults, "timed")
        if timed == defaults:
            return self._keep(timed)

        def with_kernels(kernels: dict[tuple, str]) -> Callable[[], object]:
            return lambda: (self.chosen.update(kernels), step())
        mark = self.load.mark()
        best = self._time({"timed": with_kernels(timed), "default": with_kernels(defaults)})
        if not self.load.quiet_since(mark):
            return self._defaults_unkept(defaults, "confirmed in the step")
        final = timed if best["timed"] < best["default"] else defaults
        self.chosen.update(final)
        log.info("kernels of %d shapes %s: the step took %.3f ms with them, %.3f ms with the defaults",
                 len(shapes), "kept" if final is timed else "replaced by the defaults", best["timed"] * 1e3,
                 best["default"] * 1e3)
        return self._keep(final)

    @property
    def load(self) -> HostLoad:
        return self._load or host_load.HOST_LOAD

    def _defaults_unkept(self, defaults: dict[tuple, str], how: str) -> dict[tuple, str]:
        self.chosen.update(defaults)
        log.info("the kernels of %d shapes were %s while other programs used the cores: the defaults run, and "
                 "nothing is kept", len(defaults), how)
        return defaults

    def _keep(self, kernels: dict[tuple, str]) -> dict[tuple, str]:
        if self.kept is not None:
            for shape, kernel in kernels.items():
                self.kept.put(host_key(shape), kernel)
        return kernels

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
