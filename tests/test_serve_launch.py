"""serve/launch.py's wait for a starting server: bounded by the server's own CPU time, which a busy host does not
stretch, and by a stall that uses no CPU at all, never by the wall clock a loaded host stretches (issue 71 item 8)."""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Iterator

import pytest

from serve import launch
from serve.launch import ServerProcess, cpu_seconds

pytestmark = pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/stat"),
                                reason="CPU time is read from /proc; elsewhere the bound is the wall clock")

# A server that answers GET /health with 200 after sleeping `delay` seconds: a start that takes wall time but
# almost no CPU, as every start does on a host whose other programs take the cores.
SLOW_SERVER = """
import http.server, sys, time
time.sleep(float(sys.argv[2]))
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("content-type", "application/json"); self.end_headers()
        self.wfile.write(b'{"status": "ok"}')
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


@contextlib.contextmanager
def started(tmp_path, code: str, *args: str) -> Iterator[ServerProcess]:
    """`code` run as a server, stopped when the block ends."""
    script = tmp_path / "server.py"  # a file, as ServerProcess.start fills in the command's {port}
    script.write_text(code)
    server = ServerProcess.start([sys.executable, str(script), "{port}", *args], tmp_path / "server.log")
    try:
        yield server
    finally:
        server.stop()


def test_cpu_seconds_counts_a_process_s_own_cpu_and_not_its_sleep():
    before = cpu_seconds(os.getpid())
    time.sleep(0.2)
    slept = cpu_seconds(os.getpid())
    spin_until = time.process_time() + 0.3
    while time.process_time() < spin_until:
        pass
    spun = cpu_seconds(os.getpid())
    assert slept - before < 0.1 and spun - slept >= 0.2
    assert cpu_seconds(2 ** 22 + 1) is None  # past any pid_max: no such process


def test_a_start_that_takes_wall_time_but_little_cpu_is_waited_for(tmp_path):
    """The sleep stands for the cores other programs hold: past the bound on the wall clock, within it on the CPU."""
    with started(tmp_path, SLOW_SERVER, "3") as server:
        began = time.monotonic()
        assert server.wait_until_healthy(2.0) == {"status": "ok"}
        assert time.monotonic() - began >= 2.0


def test_a_server_that_spins_without_answering_is_stopped_at_its_cpu_budget(tmp_path):
    with started(tmp_path, "while True: pass") as server:
        with pytest.raises(RuntimeError, match=r"did not answer /health within 0.5s of CPU time on each of its cores"):
            server.wait_until_healthy(0.5)
        assert cpu_seconds(server.process.pid) >= 0.5 * len(os.sched_getaffinity(server.process.pid))


def test_a_server_that_waits_on_nothing_is_named_stuck_after_a_stall(tmp_path, monkeypatch):
    """No CPU for STALLED_S of wall clock (a scripted clock: a minute a poll) is a stuck start, not a slow one."""
    monkeypatch.setattr(launch, "HEALTH_POLL_S", 0.01)
    minutes = iter(range(0, 10_000, 60))
    with started(tmp_path, "import time; time.sleep(600)") as server:
        with pytest.raises(RuntimeError, match=r"used 0\.\ds of CPU a core in the last 120s: it is stuck"):
            server.wait_until_healthy(1000, clock=lambda: float(next(minutes)))


def test_a_server_that_exits_while_starting_is_named_at_once(tmp_path):
    with started(tmp_path, "import sys; print('no model here'); sys.exit(3)") as server:
        with pytest.raises(RuntimeError, match=r"exited with code 3:\nno model here"):
            server.wait_until_healthy(1000)
