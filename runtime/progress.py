"""The progress bar every tool draws: tqdm on a terminal; in a log file or a pipe, whole lines now and then.

tqdm redraws its bar in place with carriage returns, many times a second.  A file that is not a terminal keeps
every redraw, so a log holds thousands of copies of one bar on one line.  There `ProgressBar` writes a line each
time another LINE_PERCENT of the total is done (every LINE_SECONDS when the total is unknown), and a last one
when a bar that stays is closed.
"""
from __future__ import annotations

import sys
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
