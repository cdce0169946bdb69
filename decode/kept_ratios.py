"""What a trace cost and saved on this host, kept between processes, so that a fresh process judges its first trace
from this host's own figures rather than decode/trace_payback.py's guess.

A one-off call (sample.py, a script) is a fresh process: it has timed no trace yet, so `auto` guesses the trace's
cost and a traced step's share of an eager one.  How wrong a fixed guess is depends on the host: where eager steps
are fast, a first trace costs many more of them than the guess says and saves less of each, and the guess traced a
128-token call that then ran slower than eager steps (bench/by_hand.md, "auto's first trace in a fresh process").
The process that traces a step kind records both, as ratios to an eager step, in one small JSON file per project;
the next process reads them before it decides.

    $GPT2_TRACE_TIMINGS   the file (default .cache/trace_timings.json in the project); `off` keeps nothing

A step kind is everything its timings depend on: the CPU, torch, the thread count, the model's sizes and layer
types, and the step's shape.  The file is a cache (runtime/kept_file.py): an entry that is not two positive finite
numbers is left out and said so, a file that cannot be read or parsed is ignored with one warning, and it is
replaced whole (a reader sees the old file or the new one).
"""
from __future__ import annotations

import math
from pathlib import Path

from runtime.kept_file import CACHE_FOLDER, KeptFile, kept_path

TIMINGS_ENV = "GPT2_TRACE_TIMINGS"
DEFAULT_TIMINGS = CACHE_FOLDER / "trace_timings.json"

Ratios = tuple[float, float]  # (the trace's cost, a traced step), each in eager steps


def timings_path() -> Path | None:
    """The file $GPT2_TRACE_TIMINGS names (None for `off`), else the project's default."""
    return kept_path(TIMINGS_ENV, DEFAULT_TIMINGS)


def _valid(value) -> bool:
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                    for v in value))


def _file(path: Path | None) -> KeptFile:
    return KeptFile(path, "trace timings", _valid, "two positive numbers", TIMINGS_ENV)


def read_ratios(path: Path, warn: bool = True) -> dict[str, Ratios]:
    """The entries of `path` that are two positive finite numbers (KeptFile.read)."""
    return {kind: (float(value[0]), float(value[1])) for kind, value in _file(path).read(warn).items()}


class KeptRatios:
    """The ratios per step kind in the timings file, read once on first use; `put` writes one back."""

    def __init__(self, path: Path | None):
        self.file = _file(path)

    @classmethod
    def from_environment(cls) -> KeptRatios:
        return cls(timings_path())

    @property
    def path(self) -> Path | None:
        """The file, or None when nothing is kept (`off`, or a place that could not be written)."""
        return self.file.path

    def get(self, kind: str) -> Ratios | None:
        value = self.file.get(kind)
        return None if value is None else (float(value[0]), float(value[1]))

    def put(self, kind: str, ratios: Ratios) -> None:
        """Keep `ratios` for `kind`, beside what the file holds now (another process may have added kinds)."""
        self.file.put(kind, list(ratios))
