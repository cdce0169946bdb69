"""Stopping when a scheduler asks: finish the step, save it, exit with a status that says why.

Schedulers end a job with SIGTERM and, after a grace period, SIGKILL (Slurm can also send SIGUSR1 ahead
of time, `--signal=USR1@90`); torchrun passes a SIGTERM it receives on to its workers.  The handler only
notes the signal.  After each step the ranks agree on it (one all-reduce of a flag, since the signal can
reach them between different steps), every rank stops after the same step, rank 0 saves it, and train.py
exits with 128 + the signal's number (143 for SIGTERM, 138 for SIGUSR1), so a requeued
`train.py --resume auto ...` continues with nothing lost.
"""
from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as dist

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequested(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class StopSignals:
    """While entered (in the main thread), SIGTERM and SIGUSR1 are noted instead of ending the process."""

    def __init__(self):
        self.received = 0
        self.previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():  # Python delivers signals only there
            for signum in STOP_SIGNALS:
                self.previous[signum] = signal.signal(signum, self._note)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _note(self, signum, frame) -> None:
        self.received = signum

    def check(self, ctx) -> None:
        """Raise StopRequested on every rank if any rank received a stop signal."""
        signum = self.received
        if ctx.world_size > 1:
            flag = torch.tensor([signum], device=ctx.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            signum = int(flag.item())
        if signum:
            raise StopRequested(signum)
