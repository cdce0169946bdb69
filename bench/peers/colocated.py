"""Another program on the benchmark's machine: processes that each keep one core busy, or stream memory, for
measuring how a runtime holds up when it does not have the machine to itself (a server beside a training job, a
notebook, another service) or runs on a host whose memory bus is shared."""
from __future__ import annotations

import contextlib
import sys

from bench.processes import INHERIT, start


@contextlib.contextmanager
def colocated(workload: str, count: int):
    """`count` processes running `python -m bench.workloads.<workload>` (busy_loop: a core's time;
    memory_stream: a core's time and memory bandwidth), for the block's duration (none when `count` is 0); the
    block gets them."""
    processes = [start([sys.executable, "-m", f"bench.workloads.{workload}"], stdout=INHERIT, stderr=INHERIT)
                 for _ in range(count)]
    try:
        yield processes
    finally:
        for process in processes:
            process.stop()


def busy_cores(count: int):
    """`count` processes, each a busy Python loop (bench/workloads/busy_loop.py), for the block's duration."""
    return colocated("busy_loop", count)
