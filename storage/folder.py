"""How an artifact folder is changed without a reader ever seeing half of a save.

A save is written to `.staging/` first, closed with a journal (`.staging/COMPLETE`, the list of files), and
only then moved into place.  The journal lets the next writer finish a move that a crash or `kill -9` cut
short; SIGINT, SIGTERM and SIGUSR1 are held while the files are renamed, so a Ctrl-C leaves at once either
the previous save or the whole new one.  Two advisory locks (flock: the kernel drops them when the
process dies, so a kill -9 never leaves a stale one) decide who may touch the folder:

- `.writer` is held exclusively by the one process that writes the folder, for as long as it runs
  (train.py for its whole run).  The file names that process, so a second writer is refused with its name.
  Only the writer, or a reader that takes this lock because the writer is gone, finishes an interrupted
  save or discards an incomplete one.
- `.swap` is held shared by readers while they read, and exclusively by the writer for the moment it moves
  a staged save into place: a reader sees the previous save or the next one, never a mix.  flock grants
  new shared locks while an exclusive one waits, so readers in a tight loop could keep the writer out
  for ever; a turnstile (`.gate`, which the writer holds while it waits and each reader passes through
  before it reads) lets the writer in after the reads already under way.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator

from runtime.errors import UserError
from runtime.stopping import signals_held
from runtime.parsed import Unparsable, json_value

STAGING_DIR = ".staging"
JOURNAL = "COMPLETE"
WRITER_LOCK = ".writer"
SWAP_LOCK = ".swap"
GATE_LOCK = ".gate"
# What the last save wrote, so that --overwrite removes exactly one artifact's files.
CONTENTS_FILE = ".contents"
# What ends a process or interrupts it: never in the middle of moving a save into place.
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

# Files are saved readable as the user's umask allows, like any other file they write (a shared group may read).
_UMASK = os.umask(0)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK

_held_writer_locks: dict[Path, int] = {}  # folder -> file descriptor holding its writer lock in this process
# Folders this thread is reading: a nested read (a tool that reads the config, then loads the model) must not
# queue behind a waiting writer at the gate while its outer read keeps that writer waiting.
_reading_now = threading.local()


class FolderBusy(UserError):
    """Another process is writing the folder."""


class FolderError(UserError, OSError):
    """A folder that cannot be written, or an interrupted save nobody can finish."""


class DiskFull(FolderError):
    """A save ran out of disk space (ENOSPC); the folder keeps its previous save."""


class UntrustedName(FolderError):
    """`.contents` or a save's journal names a place outside the folder."""


def _key(folder: str | Path) -> Path:
    try:
        return Path(folder).resolve()
    except (RuntimeError, OSError) as e:  # a symlink loop (RuntimeError before Python 3.13)
        raise FolderError(f"{folder} cannot be used as a folder: {e}; remove the link or choose another "
                          f"folder") from e


def holds_writer_lock(folder: str | Path) -> bool:
    return _key(folder) in _held_writer_locks


def acquire_writer_lock(folder: str | Path) -> None:
    """Make this process the folder's one writer until `release_writer_lock` or exit; re-entrant.  Finishes
    or discards a save that an earlier writer left behind."""
    key = _key(folder)
    if key in _held_writer_locks:
        return
    try:
        key.mkdir(parents=True, exist_ok=True)
        fd = _open_own_file(key / WRITER_LOCK)
    except OSError as e:
        raise FolderError(f"cannot write to {folder}: {e.strerror or e}; choose another output folder") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _describe_holder(fd)
        os.close(fd)
        raise FolderBusy(f"{folder} is being written by {holder}; wait for it to finish, stop it, or choose "
                         f"another output folder") from None
    me = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(["python", *sys.argv])[:300],
          "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    (key / SWAP_LOCK).touch()
    (key / GATE_LOCK).touch()
    _held_writer_locks[key] = fd
    try:
        _finish_interrupted_save(key)
    except BaseException:  # a journal that cannot be trusted: refuse the folder, keep nothing locked
        release_writer_lock(folder)
        raise


def _open_own_file(path: Path) -> int:
    """Open a file this folder's writer writes in place, first giving the folder a file of its own where the
    name is a hard link shared with another folder (a copy made with `cp -al`): writing through the link
    would change that folder's file too."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    if os.fstat(fd).st_nlink > 1:
        os.close(fd)
        path.unlink()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    return fd


def release_writer_lock(folder: str | Path) -> None:
    fd = _held_writer_locks.pop(_key(folder), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor drops the lock


def _describe_holder(fd: int) -> str:
    try:
        holder = json_value(os.pread(fd, 4096, 0) or b"{}")
        return f"process {holder['pid']} on {holder['host']} (`{holder['command']}`, since {holder['since']})"
    except (OSError, Unparsable, KeyError, TypeError):
        return "another process"


@contextmanager
def _lock(path: Path, mode: int) -> Iterator[None]:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # the folder was never written under this protocol: nobody to wait for
        fd = None
    if fd is None:
        yield
        return
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)


@contextmanager
def _swap_lock(folder: Path, mode: int) -> Iterator[None]:
    """Shared for readers, exclusive for the writer; see the module's docstring for the gate."""
    if mode == fcntl.LOCK_EX:
        with _lock(folder / GATE_LOCK, fcntl.LOCK_EX), _lock(folder / SWAP_LOCK, fcntl.LOCK_EX):
            yield
        return
    with _lock(folder / GATE_LOCK, fcntl.LOCK_EX):
        pass  # wait here while a writer waits
    with _lock(folder / SWAP_LOCK, fcntl.LOCK_SH):
        yield


@contextmanager
def reading(folder: str | Path) -> Iterator[None]:
    """Hold while reading a folder's files: they stay one save's files throughout.  Never changes the
    folder, except to finish a save whose writer is gone (only possible with the writer lock)."""
    folder = Path(folder)
    key, held = _key(folder), _reading_now.__dict__.setdefault("folders", set())
    if key in held:
        yield
        return
    staging = folder / STAGING_DIR
    if staging.exists() and not holds_writer_lock(folder) and (staging / JOURNAL).exists():
        _finish_as_stand_in_writer(folder)
    with _swap_lock(folder, fcntl.LOCK_SH):
        held.add(key)
        try:
            yield
        finally:
            held.discard(key)


def _finish_as_stand_in_writer(folder: Path) -> None:
    """A completed save was interrupted while being moved into place, so the folder may mix two saves: take
    the writer lock (the writer is gone, or it would hold it) and finish the move."""
    try:
        acquire_writer_lock(folder)
    except FolderBusy:
        return  # a live writer: it is still staging (the journal is its last step) and will move it itself
    except UntrustedName:
        raise
    except FolderError as e:
        raise FolderError(f"{folder} holds a save that was interrupted while being moved into place, and this "
                          f"process cannot finish it ({e}); open it once with any tool that can write there") from e
    release_writer_lock(folder)


def _finish_interrupted_save(folder: Path) -> None:
    """With the writer lock held: move a journalled save into place, or discard a save without a journal."""
    staging = folder / STAGING_DIR
    if not staging.exists():
        return
    try:
        names = json_value((staging / JOURNAL).read_bytes())
    except (OSError, Unparsable):  # no journal, or one cut short: the save never completed
        names = None
    if isinstance(names, list):
        checked_names(names, staging, staging / JOURNAL)  # where each file is taken from,
        _move_into_place(folder, checked_names(names, folder, staging / JOURNAL))  # and where it goes
    shutil.rmtree(staging, ignore_errors=True)


def checked_names(names: list, folder: Path, source: Path) -> list[str]:
    """`names`, read from the file `source`, if each is a relative path to a place inside `folder` (none
    absolute, none with `..`, none leading out through a symlink); else a FolderError naming the entry.  A
    copied, hand-edited or hostile `.contents` or journal must never make a tool move or delete a file
    outside the folder it was asked to write."""
    inside = folder.resolve()
    for name in names:
        escapes = (not isinstance(name, str) or not name or "\0" in name or Path(name).is_absolute()
                   or ".." in Path(name).parts)
        if not escapes:
            try:
                escapes = not (folder / name).resolve().is_relative_to(inside)
            except (OSError, RuntimeError):  # a symlink loop
                escapes = True
        if escapes:
            raise UntrustedName(f"{source} lists {name!r}, which is not a file inside {folder}; nothing was moved "
                              f"or deleted. The file was changed by hand or copied from elsewhere: remove the "
                              f"entry (or the file) and run again")
    return list(names)


def _move_into_place(folder: Path, names: list[str]) -> None:
    previous = previous_contents(folder)  # checked before anything moves
    with _swap_lock(folder, fcntl.LOCK_EX), _signals_held():
        _replace_files(folder, names, previous)


def _replace_files(folder: Path, names: list[str], previous: list[str]) -> None:
    """With the swap lock held: move the staged files over the folder's and record what the folder now holds."""
    staging = folder / STAGING_DIR
    for name in names:
        src = staging / name
        if src.exists():
            dst = folder / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
    write_durably(folder / CONTENTS_FILE, json.dumps(sorted(set(previous) | set(names))))
    _fsync_dir(folder)


def _signals_held():
    """Hold HELD_SIGNALS until the block ends, then deliver them to the handlers they had: a Ctrl-C (or a
    scheduler's SIGTERM) in the middle of the renames would leave the folder mixing two saves until the next writer
    finished the move, and the process that was saving could not say which save the folder holds."""
    return signals_held(HELD_SIGNALS)


def write_durably(path: Path, text: str) -> None:
    """Write, fsync and rename into place, so the file is either the old one or the whole new one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a leftover may be a hard link to another folder's file: never write through it
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_folder_atomically(folder: str | Path, writers: dict[str, Callable[[Path], None]],
                            on_saved: Callable[[], None] | None = None) -> None:
    """Write each relative path with its writer, all or nothing from a reader's point of view.  Takes the
    writer lock for the duration unless this process already holds it.  A signal that arrives while the save is
    moved into place is delivered once it is in place and `on_saved` has run, so a caller that records there what
    the folder holds is never behind the folder when the signal stops it."""
    folder = Path(folder)
    held_before = holds_writer_lock(folder)
    acquire_writer_lock(folder)
    staging = folder / STAGING_DIR
    try:
        previous = previous_contents(folder)  # checked before anything is staged
        with ExitStack() as moving:
            try:
                _stage(staging, writers)
                write_durably(staging / JOURNAL, json.dumps(sorted(writers)))
                moving.enter_context(_swap_lock(folder, fcntl.LOCK_EX))  # reads under way finish first
                moving.enter_context(_signals_held())  # until the last rename
            except BaseException as e:  # Ctrl-C or a failing writer before anything moved: the save never happened
                # The journal goes first: a kill during the removal must not leave it listing half the files.
                (staging / JOURNAL).unlink(missing_ok=True)
                shutil.rmtree(staging, ignore_errors=True)
                if _is_disk_full(e):
                    raise DiskFull(f"the disk holding {folder} is full (ENOSPC); this save was discarded and the "
                                   f"folder keeps its previous save. Free some space and run again") from None
                raise
            _replace_files(folder, sorted(writers), previous)
            if on_saved is not None:
                on_saved()
            shutil.rmtree(staging, ignore_errors=True)  # held too, so a Ctrl-C leaves no spent journal behind
    finally:
        if not held_before:
            release_writer_lock(folder)


def _stage(staging: Path, writers: dict[str, Callable[[Path], None]]) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for name, write in writers.items():
        path = staging / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
        os.chmod(path, FILE_MODE)  # some writers create private (0600) temp files
        with open(path, "rb") as f:
            os.fsync(f.fileno())


def _is_disk_full(error: BaseException | None) -> bool:
    """ENOSPC anywhere in the error's chain: a Python write raises OSError, safetensors (Rust) only says it in
    its message, and torch.save's C++ writer reports the OSError of the file object it was given as context."""
    while error is not None:
        if (isinstance(error, OSError) and error.errno == errno.ENOSPC) or "os error 28" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def previous_contents(folder: str | Path) -> list[str]:
    """The files the folder's last save wrote (empty when it records none); a FolderError if `.contents`
    names a place outside the folder."""
    folder = Path(folder)
    try:
        names = json_value((folder / CONTENTS_FILE).read_bytes())
    except (OSError, Unparsable):
        return []
    return checked_names(names, folder, folder / CONTENTS_FILE) if isinstance(names, list) else []


def remove_files(folder: str | Path, names: list[str]) -> None:
    """With the writer lock held: delete these files (and directories they leave empty)."""
    folder = Path(folder)
    checked_names(names, folder, folder / CONTENTS_FILE)
    with _swap_lock(folder, fcntl.LOCK_EX):
        for name in names:
            path = folder / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
            parent = path.parent
            while parent != folder and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent
        (folder / CONTENTS_FILE).unlink(missing_ok=True)
