"""The progress bar every tool draws: tqdm on a terminal; in a log file or a pipe, whole lines now and then.

tqdm redraws its bar in place with carriage returns, many times a second.  A file that is not a terminal keeps
every redraw, so a log holds thousands of copies of one bar on one line.  There `ProgressBar` writes a line each
time another LINE_PERCENT of the total is done (every LINE_SECONDS when the total is unknown), and a last one
when a bar that stays is closed.

A long tool (prune, quantize, the scorecard) also keeps a `Heartbeat`: its whole-run estimate once the first unit of
work has been timed, and a line at least every LINE_SECONDS while it works, whatever its bars do.
"""
from __future__ import annotations

import sys
import threading
import time

from tqdm import tqdm

LINE_PERCENT = 5
LINE_SECONDS = 30.0
# What tqdm writes to erase or move a bar: nothing a log should keep.
CURSOR_ONLY = str.maketrans("", "", "\r\n \x1b[A")


def is_terminal(file) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class _WholeLines:
    """The file a bar writes to when it is not a terminal: tqdm's own writes there only erase or move the cursor
    (`ProgressBar.display` writes the lines), so they are dropped."""

    def __init__(self, file):
        self.file = file

    def write(self, text: str) -> None:
        if text.translate(CURSOR_ONLY):
            self.file.write(text)

    def flush(self) -> None:
        self.file.flush()

    def __getattr__(self, name):  # encoding, isatty: the file's own
        return getattr(self.file, name)


class ProgressBar(tqdm):
    """tqdm, written as whole lines where its file (stderr unless given) is not a terminal (see the module)."""

    def __init__(self, *args, file=None, **kwargs):
        file = file or sys.stderr
        self.as_lines = not is_terminal(file)
        self.last_line: tuple[int, float] | None = None  # (count done, time) at the last line written
        super().__init__(*args, file=_WholeLines(file) if self.as_lines else file, **kwargs)

    def display(self, msg=None, pos=None):
        if not self.as_lines:
            return super().display(msg, pos)
        closing = self.disable  # tqdm.close disables the bar before its last display
        if msg is None and (self.line_due() or closing and self.last_line[0] != self.n):
            self.last_line = (self.n, time.monotonic())
            self.fp.file.write(self.__str__() + "\n")
            self.fp.file.flush()
        return True

    def steps(self, done: float) -> int:
        """How many LINE_PERCENTs of the total `done` is."""
        return int(100 * done / self.total // LINE_PERCENT)

    def line_due(self) -> bool:
        if self.last_line is None:
            return True
        done, written = self.last_line
        return self.steps(done) != self.steps(self.n) if self.total else time.monotonic() - written >= LINE_SECONDS


def duration(seconds: float) -> str:
    """`40 ms`, `2.5 s`, `45 s`, `12 min`, `6 h 10 min`, `9 days 4 h`: a fast step is not `0 s`."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 90:
        return f"{minutes:.0f} min"
    hours, minutes = divmod(round(minutes), 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} days {hours} h"


class Heartbeat:
    """A tool's estimate and its lines while it works: `with Heartbeat("prune") as beat:`, then `beat.phase(...)`
    when it starts something, `beat.expect(seconds_left, ...)` once it has timed enough to tell, and `beat.say(line)`
    for its own lines.  A thread writes `prune: round 2/4: fine-tune; 3 min so far, about 9 min left` whenever
    `every` seconds pass with no line of the tool's, so a phase of many minutes never runs silent."""

    def __init__(self, label: str, file=None, every: float = LINE_SECONDS):
        self.label, self.file, self.every = label, file or sys.stderr, every
        self.started = self.last_line = time.monotonic()
        self.doing = "starting"
        self.left: tuple[float, float] | None = None  # (seconds left, when that was said)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"{label} heartbeat", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()

    def phase(self, doing: str) -> None:
        self.doing = doing

    def say(self, line: str) -> None:
        """One of the tool's own lines (above any bar on a terminal)."""
        with self.lock:
            self.last_line = time.monotonic()
            tqdm.write(line, file=self.file)
            self.file.flush()

    def expect(self, seconds_left: float | None, said: str | None = None) -> None:
        """The time the rest of the run should take, as of now (None: not known until more is timed); `said`: the
        line that tells the user (with the estimate in it), printed now."""
        self.left = None if seconds_left is None else (seconds_left, time.monotonic())
        if said:
            self.say(said)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def status(self) -> str:
        now = time.monotonic()
        line = f"{self.label}: {self.doing}; {duration(now - self.started)} so far"
        if self.left is not None:
            seconds, at = self.left
            remaining = seconds - (now - at)
            line += f", about {duration(remaining)} left" if remaining > 0 else ", taking longer than estimated"
        return line

    def _beat(self) -> None:
        while not self.stopped.wait(1.0):
            if time.monotonic() - self.last_line >= self.every:
                self.say(self.status())
