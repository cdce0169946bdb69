"""Every command stops on SIGINT and SIGTERM however it was started, and says so in one closing line.

A shell starts `cmd &` in a script with SIGINT ignored, and nohup or a service manager may do the same; Python then
never raises KeyboardInterrupt, so a Ctrl-C (or `kill -INT`) sent to the command is lost.  SIGTERM, a scheduler's
or `kill`'s, ends Python at once by default: no cleanup and no word.  `stop_on_signals` (entered by every command's
`runtime.cli.entry_point`) installs one handler for both that raises `Stopped`, a KeyboardInterrupt: the code that
already cleans up after a Ctrl-C (a staged save discarded, a child process killed) does the same for SIGTERM.
The entry point then prints `closing_line` and exits with 128 + the signal's number (130 for SIGINT, 143 for
SIGTERM), as a shell reports a command a signal ended and as train.py's own stop does (training/stop_signals.py,
which replaces these handlers while it trains).  A command script calls `note_stops_while_starting` before its
imports, so a stop that arrives before `main` has begun is taken too.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_noted_while_starting: list[int] = []


class Stopped(KeyboardInterrupt):
    """A stop signal taken where the command was; `outcome` says what it leaves, once some code knows."""

    def __init__(self, signum: int = signal.SIGINT, outcome: str | None = None):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.outcome = signum, outcome

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    def saying(self, outcome: str) -> "Stopped":
        """The same stop, with what it leaves: `raise stop.saying("during round 2; round 1 ... is intact")`."""
        return Stopped(self.signum, outcome)

    @classmethod
    def of(cls, interruption: KeyboardInterrupt) -> "Stopped":
        """A Ctrl-C raised as a plain KeyboardInterrupt (Python's own handler, a second Ctrl-C) is a SIGINT."""
        return interruption if isinstance(interruption, Stopped) else cls(signal.SIGINT)


def closing_line(stop: Stopped, outcome: str | None = None) -> str:
    """`stopped by SIGTERM during round 2; round 1's checkpoint ... is intact; exit status 143`: the outcome the
    stop carries, else `outcome` (the command's word for a stop anywhere), else none."""
    said = stop.outcome or outcome
    return f"stopped by {signal.Signals(stop.signum).name}{' ' + said if said else ''}; exit status {stop.exit_status}"


@contextmanager
def leaving(outcome: str) -> Iterator[None]:
    """A stop within the block says `outcome` (what it leaves), unless code inside said more already:
    `with leaving(f"while measuring; the artifact in {out} is whole"): ...`."""
    try:
        yield
    except KeyboardInterrupt as e:
        stop = Stopped.of(e)
        raise (stop if stop.outcome else stop.saying(outcome)) from None


@contextmanager
def signals_held(signums=None) -> Iterator[None]:
    """The signals `signums` (default: SIGINT and SIGTERM) wait until the block ends, then reach the handlers they
    had: a stop while a child process is being started would otherwise leave it running, started but not yet known
    to the code that stops it (bench/demo.py), and one in the middle of a save's renames would leave a folder mixing
    two saves (storage/folder.py).  Only the main thread may change handlers, and only it runs them, so elsewhere
    nothing is held or needs to be; a handler installed outside Python (getsignal gives None) could not be put back,
    so such a signal is not held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    held = [signum for signum in (signums or STOPPING_SIGNALS) if signal.getsignal(signum) is not None]
    previous = {signum: signal.signal(signum, lambda received, frame: arrived.append(received)) for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)


def stop_by_default() -> None:
    """SIGTERM ends the process at once and SIGINT raises Python's own KeyboardInterrupt, as in a fresh interpreter:
    for a torchrun rank outside its training loop, which its launcher stops with SIGTERM and, after a grace period,
    SIGKILL, and which may be waiting in a collective or a rendezvous, where no Python handler would run."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def note_stops_while_starting() -> None:
    """Called by a command script first of all, before its imports (torch's take seconds), which no handler that
    raises may interrupt: a stop sent meanwhile is noted, and `stop_on_signals` takes it as its block begins."""
    for signum in STOPPING_SIGNALS:
        signal.signal(signum, lambda received, frame: _noted_while_starting.append(received))


def take_stop_noted_while_starting() -> None:
    """Raise the first stop noted by `note_stops_while_starting`, if one came."""
    if _noted_while_starting:
        raise Stopped(_noted_while_starting.pop(0))


def _raise_stopped(signum, frame) -> None:
    raise Stopped(signum)


def ignore_stop_signals() -> None:
    """While a command says how it stopped: within `stop_on_signals`, whose end puts the handlers back."""
    if threading.current_thread() is threading.main_thread():
        for signum in STOPPING_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Stopped` in the block, whatever handler (SIG_IGN included) the process was started
    with; the previous handlers come back after it.  Signals reach only the main thread: elsewhere it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise_stopped) for signum in STOPPING_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: installed outside Python, which cannot be put back
                signal.signal(signum, handler)
