"""Start `python -m serve` as a child process on a free loopback port, wait until it answers, always stop it.

Used by the demo, the load test and the tests, which all need a real server with a real port.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx

LOOPBACK = "127.0.0.1"
HEALTH_POLL_S = 0.05  # between /health tries while the server starts
# A start-up is bounded by the server's own CPU time, which a busy host does not stretch as it stretches the wall
# clock (a 2-core host at load 14 gives a process about a seventh of a core).  A server that waits on something that
# never comes uses no CPU, so one that used less than STALLED_CPU_S in STALLED_S of wall clock is stuck: even at a
# load of 50 on 2 cores a starting process gets several seconds of CPU in that span.
STALLED_S = 120.0
STALLED_CPU_S = 1.0
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def cpu_seconds(pid: int) -> float | None:
    """The CPU time process `pid` has used, its every thread and the children it has waited for; None where
    /proc/PID/stat cannot be read (not Linux, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # After the command's name, in parentheses (which may hold spaces and parentheses), field 3 (state) comes
    # first: utime, stime, cutime and cstime are fields 14 to 17.
    fields = text.rsplit(")", 1)[-1].split()
    try:
        return sum(int(v) for v in fields[11:15]) * _TICK_S
    except ValueError:
        return None


class StartBudget:
    """How long a starting process `pid` may go on: `timeout_s` seconds of its CPU time (of the wall clock where
    /proc cannot be read), and never STALLED_S of wall clock with less than STALLED_CPU_S of CPU."""

    def __init__(self, pid: int, timeout_s: float, clock: Callable[[], float] = time.monotonic):
        self.pid, self.timeout_s, self.clock = pid, timeout_s, clock
        self.started = self.stall_from = clock()
        self.stall_used = 0.0

    def spent(self) -> str | None:
        """Why the start has gone on too long ("within 120s of its CPU time", "...: it is stuck"), or None."""
        now, cpu = self.clock(), cpu_seconds(self.pid)
        used = now - self.started if cpu is None else cpu
        if used >= self.timeout_s:
            return f"within {self.timeout_s:g}s of {'wall clock' if cpu is None else 'its CPU time'}"
        if now - self.stall_from >= STALLED_S:
            if used - self.stall_used < STALLED_CPU_S:
                return f"and used {used - self.stall_used:.1f}s of CPU in the last {STALLED_S:g}s: it is stuck"
            self.stall_from, self.stall_used = now, used
        return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m serve` on `checkpoint`; or, from `start`, any server that answers GET /health with 200 once it
    is ready (bench/peers/llama_cpp_peer.py starts llama.cpp's llama-server so)."""

    def __init__(self, checkpoint: str | Path, log_path: str | Path, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self._start([sys.executable, "-m", "serve", "--checkpoint", str(checkpoint), "--host", LOOPBACK,
                     "--port", str(self.port), *(extra_args or [])], log_path, env)

    @classmethod
    def start(cls, command: list[str], log_path: str | Path) -> ServerProcess:
        """`command` with `{host}` and `{port}` in its arguments filled in with a free loopback port."""
        server = cls.__new__(cls)
        server.port = free_port()
        server.url = f"http://{LOOPBACK}:{server.port}"
        server._start([arg.format(host=LOOPBACK, port=server.port) for arg in command], log_path, None)
        return server

    def _start(self, command: list[str], log_path: str | Path, env: dict[str, str] | None) -> None:
        self.log_path = Path(log_path)
        self.log_file = open(self.log_path, "w")
        self.process = subprocess.Popen(command, stdout=self.log_file, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})})

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_until_healthy(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> dict:
        """The server's /health answer once it is 200, within StartBudget(timeout_s); one that exits is an error at
        once."""
        budget = StartBudget(self.process.pid, timeout_s, clock)
        # One client for every try: httpx.get builds a client, and with it an SSL context (CPU time spent loading
        # the CA bundle), on each call, taken from the starting server on a small machine.
        with httpx.Client(timeout=2, verify=False) as client:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the server exited with code {self.process.returncode}:\n{self.log()}")
                try:
                    response = client.get(f"{self.url}/health")
                    if response.status_code == 200:
                        return response.json()
                except httpx.TransportError:
                    pass
                if spent := budget.spent():
                    raise RuntimeError(f"the server did not answer /health {spent}:\n{self.log()}")
                time.sleep(HEALTH_POLL_S)

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM (uvicorn lets in-flight requests finish), then SIGKILL if it does not exit in time."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_file.close()
        return self.process.returncode


@contextlib.contextmanager
def running(server: ServerProcess, startup_timeout_s: float = 120) -> Iterator[ServerProcess]:
    """`server` once it answers /health (within `startup_timeout_s` of its CPU time: wait_until_healthy), stopped on
    leaving the block however it is left."""
    try:
        server.wait_until_healthy(startup_timeout_s)
        yield server
    finally:
        server.stop()


def running_server(checkpoint: str | Path, log_path: str | Path, extra_args: list[str] | None = None,
                   env: dict[str, str] | None = None, startup_timeout_s: float = 120):
    """`python -m serve --checkpoint checkpoint` with `extra_args`, as `running` gives it."""
    return running(ServerProcess(checkpoint, log_path, extra_args, env), startup_timeout_s)
