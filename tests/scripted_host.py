"""A host whose other programs' CPU use the test sets (`others`, in cores), read on a fake clock: the counters that
runtime/host_load.py reads from /proc/stat, advanced as that use says."""
from __future__ import annotations

from runtime.host_load import CpuRead, HostLoad


class FakeClock:
    """Seconds that pass only when a test (or a step it scripts) says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ScriptedHost:
    """Other programs use `others` cores from when it is set; `load` reads it as runtime/host_load.py reads a
    real host (the process's own CPU time cancels out of what it measures, so it is left at 0)."""

    def __init__(self, clock: FakeClock | None = None, cores: int = 2):
        self.clock = clock or FakeClock()
        self._others, self._since, self._busy_s = 0.0, self.clock(), 0.0
        self.load = HostLoad(read=self.read, clock=self.clock, cores=cores)

    @property
    def others(self) -> float:
        return self._others

    @others.setter
    def others(self, cores: float) -> None:
        self._accrue()
        self._others = cores

    def _accrue(self) -> None:
        now = self.clock()
        self._busy_s += self._others * (now - self._since)
        self._since = now

    def read(self) -> CpuRead:
        self._accrue()
        return CpuRead(self.clock(), self._busy_s, 0.0)


def quiet_host() -> HostLoad:
    """A host no other program uses."""
    return ScriptedHost().load
