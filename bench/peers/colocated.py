"""Another program on the benchmark's machine: processes that each keep one core busy, for measuring how a
runtime holds up when it does not have the machine to itself (a server beside a training job, a notebook,
another service)."""
from __future__ import annotations

import contextlib
import sys

from bench.processes import INHERIT, start

# A plain Python loop: one core's worth of work that never sleeps and touches little memory, so it takes CPU time
# from the runtime under test and not memory bandwidth.
BUSY_LOOP = "while True:\n    pass\n"


@contextlib.contextmanager
def busy_cores(count: int):
    """`count` processes, each a busy Python loop, for the block's duration (none when `count` is 0); the block
    gets them."""
    processes = [start([sys.executable, "-c", BUSY_LOOP], stdout=INHERIT, stderr=INHERIT) for _ in range(count)]
    try:
        yield processes
    finally:
        for process in processes:
            process.stop()
