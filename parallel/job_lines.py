"""A line that every rank of a torchrun job would print alike, printed once for the job.

A user error (a refused --resume, a missing file) is found by every rank, each running the same command on the same
files, and each would print the same `error:` line: four ranks, four lines.  The ranks agree through the job's key-value
store (torchrun's agent holds it, at MASTER_ADDR:MASTER_PORT, from before the ranks start until after they end): the
first rank to count a line prints it; a different line (one rank's own problem) is printed too.  Where the store cannot
be reached (a rank-hosted store whose rank has gone), the line is printed: twice is better than never."""
from __future__ import annotations

import datetime
import hashlib
import os
import sys

import torch.distributed as dist

STORE_CONNECT_S = 5.0  # the agent's store answers at once; a gone one must not hold up the exit for long


def print_once_per_job(line: str) -> None:
    """Print `line` to stderr unless another rank of this torchrun job (this attempt of it) printed the same line."""
    if first_to_say(line):
        print(line, file=sys.stderr, flush=True)


def first_to_say(line: str) -> bool:
    env = os.environ
    if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:  # not under torchrun: nobody else would say it
        return True
    attempt = f"{env.get('TORCHELASTIC_RUN_ID', '')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    key = f"job_lines/{attempt}/{hashlib.sha256(line.encode()).hexdigest()}"
    try:
        store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                              timeout=datetime.timedelta(seconds=STORE_CONNECT_S))
        return store.add(key, 1) == 1
    except Exception:  # any failure to reach the store means: say it
        return True
