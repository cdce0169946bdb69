"""Stopping when a scheduler (or Ctrl-C) asks: with the last whole step saved before the launcher's SIGKILL, and an
exit status that says why.

Schedulers end a job with SIGTERM and, after a grace period, SIGKILL (Slurm can also send SIGUSR1 ahead of time,
`--signal=USR1@90`); torchrun passes a SIGTERM or SIGINT it receives on to its workers and kills them after a grace
period of its own (training/stop_grace.py says how long, and how that is learnt).  A step of many micro-batches can
take minutes, and one micro-batch of GPT-2 Medium on a CPU takes longer than torchrun's grace, so the handler only notes
the signal (and rank 0 says at once what will happen) and the ranks agree on it at points every rank reaches in the
same order: after every micro-batch, and, while micro-batches are long against the grace (training/stop_points.py),
before each transformer block's forward and after its backward.  One agreement is one all-reduce of a few numbers on a
CPU (gloo) group of its own, since the signal can reach the ranks at different times; every rank takes the same
decision at the same point, so none is left waiting in a collective the others abandoned.  A validation checks before
each batch and is abandoned.  The step under way is dropped: its partial gradients are discarded and the data position
and RNG go back to its start, so the saved step is exactly the last whole one and a resumed run equals one never
stopped.  The one exception is a step whose last micro-batch is under way when the signal comes and is expected to end,
with the save after it, well within the grace: it finishes and is saved.  train.py exits with 128 + the signal's number
(143 for SIGTERM, 138 for SIGUSR1, 130 for SIGINT), so a requeued `train.py --resume auto ...` continues with nothing
lost.  A second Ctrl-C stops at once, without saving (one within a second of the first is taken for the launcher
passing the same Ctrl-C on): the handlers stay in place while the stop saves, so it interrupts that save, which
storage/folder.py discards, and the run ends with one line and exit status 130.
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
    def __init__(self, signum: int, received_at: float):
        """`received_at`: when this rank learnt of the stop (time.monotonic), from which its grace runs."""
        super().__init__(signal.Signals(signum).name)
        self.signum, self.received_at = signum, received_at

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class StopSignals:
    """While entered (in the main thread), SIGTERM, SIGUSR1 and a first SIGINT are noted instead of ending the
    process.  When the first arrives, `on_signal(name)` is called: it says what will happen and returns whether the
    step under way is to finish (True) or be dropped (False).  `check` is where the ranks agree."""

    def __init__(self, ctx, on_signal: Callable[[str], bool] = lambda name: False):
        self.ctx = ctx
        self.received, self.received_at = 0, 0.0
        self.finish: bool | None = None  # this rank's decision, taken when its first signal came
        self.agreed: tuple[int, bool] | None = None  # (signal, finish) once the ranks have agreed on a stop
        self.on_signal = on_signal
        self.previous: dict[int, object] = {}
        self.group = None  # where the ranks agree: a CPU (gloo) group of its own, apart from the model's collectives

    def __enter__(self) -> "StopSignals":
        if self.ctx.world_size > 1 and self.group is None:  # every rank enters at the same point, as a new group needs
            self.group = dist.new_group(backend="gloo")
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
            if self.agreed is None:  # else the ranks have decided already, and the closing line says how
                self.finish = self.on_signal(signal.Signals(signum).name)

    def agree(self, *values: float) -> tuple[int, bool, list[float]]:
        """The ranks' agreement (every rank must call it at the same point): whether any rank received a stop signal
        and which, whether the step under way finishes (rank 0's decision if it has one, else the others': dropping
        wins), and the maximum over the ranks of each of `values`."""
        code = 0 if self.finish is None else 1 if self.finish else 2  # 2: drop the step
        local = [float(self.received), float(code if self.ctx.rank == 0 else 0), float(code), *values]
        if self.ctx.world_size > 1:
            flags = torch.tensor(local, dtype=torch.float64)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
            local = flags.tolist()
        signum, decided = int(local[0]), int(local[1]) or int(local[2])
        if self.agreed is None and signum:  # the first agreement on a stop holds to the end, on every rank alike
            self.agreed = (signum, decided == 1)
            if not self.received:  # a signal that reaches this rank later is the same stop
                self.received, self.received_at = signum, time.monotonic()
        return signum, self.agreed is not None and self.agreed[1], local[3:]

    def check(self, *values: float, finishing: bool = False) -> list[float]:
        """Raise StopRequested on every rank if any rank received a stop signal, unless `finishing` (a point inside
        the step's last micro-batch) and the ranks agreed to finish the step; else return the maxima of `values`."""
        signum, finish, maxima = self.agree(*values)
        if signum and not (finishing and finish):
            raise StopRequested(signum, self.received_at)
        return maxima
