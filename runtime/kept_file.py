"""A small JSON file of what one process measured on this host, kept for the processes after it: what a decode
step's trace cost and saved (decode/kept_ratios.py), which kernel runs each product shape (model/kernel_choice.py).

Each file is one JSON object whose keys say everything an entry depends on (the CPU, torch, the shape, ...), in
the project's .cache/ folder unless an environment variable names another file, or `off` to keep nothing.  It is a
cache, so no content of it can stop a process or be trusted unchecked: an entry its owner's check rejects is left
out and said so, a file that cannot be read or parsed is ignored with one warning, and a place that cannot be
written is given up with one warning.  A write rereads the file and adds its entry beside what other processes kept,
then replaces the file whole through a temporary file of the process's own, as several processes may write at
once: a reader sees the old file or the new one.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

CACHE_FOLDER = Path(__file__).resolve().parent.parent / ".cache"
OFF = "off"


def kept_path(env: str, default: Path) -> Path | None:
    """The file the environment variable `env` names (None for `off`), else `default`."""
    value = os.environ.get(env, "")
    if value == OFF:
        return None
    return Path(value).expanduser() if value else default


class KeptFile:
    """The entries of one kept file that pass `valid`, read once on first use; `put` writes one back.

    `what` names the entries in messages ("trace timings"), `valid_text` says what `valid` accepts ("two positive
    numbers"), `env` is the variable that moves the file or turns it off."""

    def __init__(self, path: Path | None, what: str, valid: Callable[[object], bool], valid_text: str, env: str):
        self.path, self.what, self.valid, self.valid_text, self.env = path, what, valid, valid_text, env
        self._kept: dict[str, object] | None = None

    def read(self, warn: bool = True) -> dict[str, object]:
        """The file's entries that pass `valid`; none when it is missing or unreadable.  What is ignored or left out
        is said in one warning, unless `warn` is False (a reread before a write: said already)."""
        if self.path is None:
            return {}
        say = log.warning if warn else log.debug
        try:
            raw = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
            say("ignoring the %s in %s (%s): delete the file, or set %s=off", self.what, self.path, e, self.env)
            return {}
        if not isinstance(raw, dict):
            say("ignoring the %s in %s: not a JSON object; delete the file, or set %s=off", self.what, self.path,
                self.env)
            return {}
        kept = {key: value for key, value in raw.items() if self.valid(value)}
        if len(kept) < len(raw):
            say("left out %d of the %d %s in %s that are not %s", len(raw) - len(kept), len(raw), self.what,
                self.path, self.valid_text)
        return kept

    def get(self, key: str):
        if self._kept is None:
            self._kept = self.read()
        return self._kept.get(key)

    def put(self, key: str, value) -> None:
        """Keep `value` for `key`, beside what the file holds now (another process may have added keys)."""
        if self.path is None:
            return
        kept = self._kept = {**self.read(warn=False), key: value}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _replace(self.path, json.dumps(kept, indent=1) + "\n")
        except OSError as e:  # a read-only project: later processes measure again
            log.warning("could not keep the %s in %s (%s); set %s to a writable file, or to off", self.what,
                        self.path, e, self.env)
            self.path = None


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
