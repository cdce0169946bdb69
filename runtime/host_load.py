"""How much of this process's cores other programs used just now: the one measurement of the host that the decode
steps' run-time choices read (decode/step_threads.py, decode/trace_payback.py, model/kernel_choice.py).

A decision taken from step timings outlives the load it was timed under: steps timed while six processes warmed up
together held a slower path long after the host was quiet (issue 70).  The CPU time the host's cores spent busy is
counted by the kernel (/proc/stat, per core), and so is this process's own (its every thread), so the difference
over a span is what other programs took of the cores this process may run on, in cores, as it was in that span:

    others = (busy time of the process's cores - the process's own CPU time) / wall time

It is read afresh at most every READ_EVERY_S and counts only the last WINDOW_S, so a load is seen within about a
third of a second of its start and forgotten as soon after its end.  A host where /proc/stat cannot be read (not Linux) reads as
quiet: the choices then run their quiet-host rule.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

# The span other programs' use is measured over; nothing older counts.  Short, as a process that starts decoding
# right after another ended (a user's turn after a colleague's, a benchmark's next side) would otherwise take the
# other's last half second of steps for a load still running; long enough to hold 50 of the kernel's clock ticks
# on 2 cores (USER_HZ of 100), so that one busy core reads as 1.0 +- 0.1.
WINDOW_S = 0.25
READ_EVERY_S = 0.05  # /proc/stat is read at most this often (a read costs tens of microseconds)
# Other programs using less than this share of one core over a span leave it quiet: timings made then are kept for
# other processes (decode/kept_ratios.py, model/kernel_choice.py).  A shared host's daemons and shells stay below it.
QUIET_CORES = 0.25
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


@dataclass(frozen=True)
class CpuRead:
    """One read of the counters, in seconds: the wall clock, the busy time of the process's cores (every program's,
    summed over the cores), and the process's own CPU time."""
    wall_s: float
    busy_s: float
    own_s: float


def others_between(before: CpuRead, after: CpuRead) -> float:
    """Cores' worth of CPU that other programs used between two reads (0 for reads at the same instant)."""
    wall = after.wall_s - before.wall_s
    if wall <= 0:
        return 0.0
    return max(0.0, (after.busy_s - before.busy_s) - (after.own_s - before.own_s)) / wall


def process_cores() -> int:
    """How many cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def read_proc_stat(clock: Callable[[], float] = time.monotonic) -> CpuRead | None:
    """The counters now, over the cores this process may run on; None where /proc/stat cannot be read."""
    cpus = {n for n in os.sched_getaffinity(0)} if hasattr(os, "sched_getaffinity") else None
    try:
        with open("/proc/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return CpuRead(clock(), busy_ticks(text, cpus) * _TICK_S, time.process_time())


def busy_ticks(proc_stat: str, cpus: set[int] | None) -> int:
    """The busy ticks of the cores `cpus` (None: every core) in the text of /proc/stat: every state but idle and
    iowait, summed over the cores' `cpuN` lines (steal, the time a hypervisor gave a core's slot to another machine,
    is taken by others all the same); a line that is not `cpuN` and eight counts is left out."""
    ticks = 0
    for line in proc_stat.splitlines():
        fields = line.split()
        if not fields or not fields[0].startswith("cpu") or not fields[0][3:].isdigit():
            continue
        if cpus is not None and int(fields[0][3:]) not in cpus:
            continue
        values = fields[1:9]
        if len(values) == 8 and all(v.isdigit() for v in values):
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, values)
            ticks += user + nice + system + irq + softirq + steal
    return ticks


class HostLoad:
    """Other programs' use of this process's cores over the last WINDOW_S (`others`), and whether a span between two
    reads was quiet (`quiet_since`).  `read`: the counters now (a test passes scripted ones), None when unreadable;
    `clock`: the read's time base, seconds; `cores`: how many cores the counters cover (default: those this
    process may run on)."""

    def __init__(self, read: Callable[[], CpuRead | None] = read_proc_stat, clock: Callable[[], float] = time.monotonic,
                 window_s: float = WINDOW_S, cores: int | None = None):
        self.read, self.clock, self.window_s = read, clock, window_s
        self.cores = cores or process_cores()
        self._reads: list[CpuRead] = []  # oldest first: the newest one older than the window, then those within

    def now(self) -> CpuRead | None:
        """The newest read, made afresh when the last is READ_EVERY_S old."""
        if not self._reads or self.clock() - self._reads[-1].wall_s >= READ_EVERY_S:
            read = self.read()
            if read is None:
                return None
            self._reads.append(read)
            # The span starts at the newest read older than the window, unless even that is older than two windows
            # (no step ran for a while): what the host did then says nothing of now, and the next read starts anew.
            start = read.wall_s - self.window_s
            while len(self._reads) > 1 and (self._reads[0].wall_s < start - self.window_s
                                            or (len(self._reads) > 2 and self._reads[1].wall_s <= start)):
                del self._reads[0]
        return self._reads[-1]

    def others(self) -> float:
        """Cores' worth that other programs used over about the last WINDOW_S (0 before two reads, or unreadable)."""
        newest = self.now()
        return others_between(self._reads[0], newest) if newest is not None else 0.0

    def free_cores(self) -> float:
        """How many of the process's cores other programs left free over the last WINDOW_S."""
        return max(0.0, self.cores - self.others())

    def quiet_since(self, before: CpuRead | None) -> bool:
        """Whether other programs used less than QUIET_CORES from `before` (a `mark`) until now."""
        if before is None:
            return True
        after = self.read()
        return after is None or others_between(before, after) < QUIET_CORES

    def mark(self) -> CpuRead | None:
        """A fresh read, to judge a span from (`quiet_since`)."""
        return self.read()

    def quiet(self) -> bool:
        """Whether the last WINDOW_S was quiet."""
        return self.others() < QUIET_CORES


# The process's: every choice reads the same window.
HOST_LOAD = HostLoad()
