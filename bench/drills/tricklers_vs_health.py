"""Slow clients: connections trickle headers one byte at a time while /health is probed; a failure is a probe
slower than 1 s, or a trickler still connected 3 s after the read deadline.
"""
from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from bench.drills.drill import Drill, DrillSettings, small_artifact
from serve.launch import LOOPBACK, running_server


def run(s: DrillSettings, work: Path) -> Drill:
    started = time.perf_counter()
    probes, slow_probes, notes = 0, 0, []
    args = ["--read-timeout-s", str(s.read_timeout_s), "--max-connections", str(s.slow_clients + 16)]
    with running_server(small_artifact(work / "serve-model"), work / "slow-server.log", args) as server:
        tricklers = [socket.create_connection((LOOPBACK, server.port), timeout=5) for _ in range(s.slow_clients)]
        open_ones = set(range(len(tricklers)))
        for t in tricklers:
            t.setblocking(False)
            t.sendall(b"POST /generate HTTP/1.1\r\n")
        deadline = time.monotonic() + s.read_timeout_s + 3
        while open_ones and time.monotonic() < deadline:
            for i in list(open_ones):
                try:
                    if tricklers[i].recv(4096) == b"":
                        open_ones.discard(i)
                        continue
                    open_ones.discard(i)  # answered (408): stop sending
                except BlockingIOError:
                    try:
                        tricklers[i].sendall(b"x")
                    except OSError:
                        open_ones.discard(i)
                except OSError:
                    open_ones.discard(i)
            sent = time.monotonic()
            try:
                ok = httpx.get(f"{server.url}/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                ok = False
            probes += 1
            slow_probes += (not ok) or time.monotonic() - sent > 1.0
            time.sleep(0.25)
        for t in tricklers:
            t.close()
    if open_ones:
        notes.append(f"{len(open_ones)} slow clients still connected {s.read_timeout_s + 3:g} s after connecting")
    if slow_probes:
        notes.append(f"{slow_probes} of {probes} /health probes failed or took over 1 s")
    return Drill(f"{s.slow_clients} slow clients vs /health", probes, slow_probes + len(open_ones), "-",
                 time.perf_counter() - started, notes)
