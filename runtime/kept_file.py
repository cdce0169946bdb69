"""A small JSON file of what one process measured on this host, kept for the processes after it: what a decode
step's trace cost and saved (decode/kept_ratios.py), which kernel runs each product shape (model/kernel_choice.py).

Each file is one JSON object whose keys say everything an entry depends on (the CPU, torch, the shape, ...), in
the project's .cache/ folder unless an environment variable names another file, or `off` to keep nothing.  It is a
cache, so no content of it can stop a process or be trusted unchecked, and it is read as warily as a user's file:
only a regular file of at most MAX_BYTES is read (a FIFO would block the read, a link to /dev/zero never end it, a
file of gigabytes fill the memory), an entry its owner's check rejects is left out and said so, and a file that
cannot be read or parsed (nested past the parser's depth, say) is ignored with one warning and replaced whole at
the next write.  A place that cannot be written is given up with one warning.  A write holds a lock on the file's
folder while it rereads the file, adds its entry beside what other processes kept and replaces the file through a
temporary file of its own: two processes writing at once keep both their entries, and a reader, which takes no
lock, sees the old file or the new one.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from runtime.parsed import Unparsable, json_value

log = logging.getLogger(__name__)

CACHE_FOLDER = Path(__file__).resolve().parent.parent / ".cache"
OFF = "off"
# Entries are a few hundred bytes, one per host, torch and shape: a file of thousands of them is under a megabyte.
MAX_BYTES = 4 * 1024 * 1024


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
            raw = json_value(_bounded_read(self.path))
        except FileNotFoundError:
            return {}
        except (OSError, Unparsable) as e:
            say("ignoring the %s in %s (%s): delete the file, or set %s=off", self.what, self.path, _reason(e),
                self.env)
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
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with _writers_lock(self.path.parent):
                kept = {**self.read(warn=False), key: value}
                _replace(self.path, json.dumps(kept, indent=1) + "\n")
        except OSError as e:  # a read-only project: later processes measure again, this one keeps what it knows
            kept = {**(self._kept or {}), key: value}
            log.warning("could not keep the %s in %s (%s); set %s to a writable file, or to off", self.what,
                        self.path, e, self.env)
            self.path = None
        self._kept = kept


def _bounded_read(path: Path) -> bytes:
    """The bytes of `path` if it is a regular file of at most MAX_BYTES, else an OSError saying what it is.  Opened
    without blocking, so a FIFO is refused, never waited on; checked on the open file, so a link counts as what it
    leads to."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"not a regular file (a {_kind(info.st_mode)})")
        if info.st_size > MAX_BYTES:
            raise OSError(f"{info.st_size:,} bytes, more than the {MAX_BYTES:,} a kept file may hold")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_BYTES + 1)  # a file still growing is held to the bound too
        if len(data) > MAX_BYTES:
            raise OSError(f"more than the {MAX_BYTES:,} bytes a kept file may hold")
        return data
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    return "folder" if stat.S_ISDIR(mode) else "FIFO" if stat.S_ISFIFO(mode) else \
        "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "socket" if stat.S_ISSOCK(mode) else "special file"


def _reason(e: OSError | Unparsable) -> str:
    return getattr(e, "strerror", None) or str(e)  # an OSError of the system's: its words, without the path again


@contextmanager
def _writers_lock(folder: Path) -> Iterator[None]:
    """Held by one writer at a time among the processes keeping files in `folder` (an flock on the folder itself,
    released when the process ends however it ends): a reread-and-replace is never interleaved with another."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


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
