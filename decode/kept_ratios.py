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
types, and the step's shape.  The file is a cache: an entry that is not two positive finite numbers is left out and
said so, a file that cannot be read or parsed is ignored with one warning, and it is replaced whole (a reader sees
the old file or the new one).
"""
from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

TIMINGS_ENV = "GPT2_TRACE_TIMINGS"
DEFAULT_TIMINGS = Path(__file__).resolve().parent.parent / ".cache" / "trace_timings.json"
OFF = "off"

Ratios = tuple[float, float]  # (the trace's cost, a traced step), each in eager steps


def timings_path() -> Path | None:
    """The file $GPT2_TRACE_TIMINGS names (None for `off`), else the project's default."""
    value = os.environ.get(TIMINGS_ENV, "")
    if value == OFF:
        return None
    return Path(value).expanduser() if value else DEFAULT_TIMINGS


def read_ratios(path: Path, warn: bool = True) -> dict[str, Ratios]:
    """The entries of `path` that are two positive finite numbers; none when it is missing or unreadable.  What is
    ignored or left out is said in one warning, unless `warn` is False (a reread before a write: said already)."""
    say = log.warning if warn else log.debug
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        say("ignoring the trace timings in %s (%s): delete the file, or set %s=off", path, e, TIMINGS_ENV)
        return {}
    if not isinstance(raw, dict):
        say("ignoring the trace timings in %s: not a JSON object; delete the file, or set %s=off", path, TIMINGS_ENV)
        return {}
    kept = {kind: (float(value[0]), float(value[1])) for kind, value in raw.items() if _valid(value)}
    if len(kept) < len(raw):
        say("left out %d of the %d trace timings in %s that are not two positive numbers", len(raw) - len(kept),
            len(raw), path)
    return kept


def _valid(value) -> bool:
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                    for v in value))


class KeptRatios:
    """The ratios per step kind in the timings file, read once on first use; `put` writes one back."""

    def __init__(self, path: Path | None):
        self.path = path
        self._kept: dict[str, Ratios] | None = None

    @classmethod
    def from_environment(cls) -> KeptRatios:
        return cls(timings_path())

    def get(self, kind: str) -> Ratios | None:
        return self._read().get(kind)

    def put(self, kind: str, ratios: Ratios) -> None:
        """Keep `ratios` for `kind`, beside what the file holds now (another process may have added kinds)."""
        if self.path is None:
            return
        kept = self._kept = {**read_ratios(self.path, warn=False), kind: ratios}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _replace(self.path, json.dumps({k: list(v) for k, v in kept.items()}, indent=1) + "\n")
        except OSError as e:  # a read-only project: later processes guess again
            log.warning("could not keep the trace timings in %s (%s); set %s to a writable file, or to off",
                        self.path, e, TIMINGS_ENV)
            self.path = None

    def _read(self) -> dict[str, Ratios]:
        if self._kept is None:
            self._kept = {} if self.path is None else read_ratios(self.path)
        return self._kept


def _replace(path: Path, text: str) -> None:
    """Write a temporary file of this process's own beside `path`, then rename it over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
