"""Stopping when a scheduler (or Ctrl-C) asks: within one micro-batch, saving the last whole step, with an exit
status that says why.

Schedulers end a job with SIGTERM and, after a grace period, SIGKILL (Slurm can also send SIGUSR1 ahead of time,
`--signal=USR1@90`); torchrun passes a SIGTERM or SIGINT it receives on to its workers and kills them after a grace
period of its own.  A step of many micro-batches can take minutes, so the handler only notes the signal (and rank 0
says at once what will happen), and the ranks agree on it after every micro-batch: one all-reduce of a flag, since the
signal can reach them at different times (on a CPU group: no GPU synchronisation); a validation checks before each
batch and is abandoned.  The step under way is dropped (unless its last micro-batch has begun: it then finishes):
its partial gradients are discarded and the data position and RNG go back to its start, so the saved step is
exactly the last whole one and a resumed run equals one never stopped.  train.py exits with 128 + the signal's
number (143 for SIGTERM, 138 for SIGUSR1, 130 for SIGINT), so a requeued `train.py --resume auto ...` continues
with nothing lost.  A second Ctrl-C stops at once, without saving (one within a second of the first is taken for
the launcher passing the same Ctrl-C on): the handlers stay in place while the stop saves, so it interrupts that save,
which storage/folder.py discards, and the run ends with one line and exit status 130.
"""
from __future__ import annotations

import signal
import threading
import time
from typing import Callable

import torch
import torch.distributed as dist

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
REPEATED_CTRL_C_S = 1.0


class StopRequested(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class StopSignals:
    """While entered (in the main thread), SIGTERM, SIGUSR1 and a first SIGINT are noted instead of ending the
    process; `announce(name)` is called when the first arrives."""

    def __init__(self, announce: Callable[[str], None] = lambda name: None):
        self.received, self.received_at = 0, 0.0
        self.announce = announce
        self.previous: dict[int, object] = {}
        self.group = None  # where the ranks agree: a CPU (gloo) group, made on first use
        self.group_made = False

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():  # Python delivers signals only there
            for signum in STOP_SIGNALS:
                self.previous[signum] = signal.signal(signum, self._note)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _note(self, signum, frame) -> None:
        now = time.monotonic()
        if self.received == signal.SIGINT == signum and now - self.received_at > REPEATED_CTRL_C_S:
            raise KeyboardInterrupt  # a second Ctrl-C: at once
        if not self.received:
            self.received, self.received_at = signum, now
            self.announce(signal.Signals(signum).name)

    def check(self, ctx) -> None:
        """Raise StopRequested on every rank if any rank received a stop signal (every rank must call it)."""
        signum = self.received
        if ctx.world_size > 1:
            if not self.group_made:  # made by every rank at the same call, as a new group must be
                self.group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
                self.group_made = True
            flag = torch.tensor([signum])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            signum = int(flag.item())
        if signum:
            raise StopRequested(signum)
