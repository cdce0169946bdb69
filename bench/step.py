"""train.py's single-device training step, in-process, for the experiments that must catch an
out-of-memory error or time the phases of one step separately.

The step is the one train.py runs with `--parallel none --grad-accum 1`: next batch, forward under
the precision policy's autocast, backward (through the gradient scaler), clip, optimizer step,
zero grads, one device sync to read the loss.  Experiments that need whole runs (loss curves,
memory of a fresh process, several ranks) run train.py itself through bench/runner.py.
"""
from __future__ import annotations

import contextlib
import gc
import time
from collections import defaultdict

import torch

from model.gpt import GPT
from model.optim import build_optimizer
from runtime.device import Precision, synchronize

PHASES = ("data", "forward", "backward", "optimizer", "evaluation", "other")
# On CPU PyTorch reports an allocation failure as a plain RuntimeError with this text.
CPU_ALLOCATION_FAILURE = "can't allocate memory"


class PhaseClock:
    """Seconds per named phase; the device is synchronised at each boundary so that asynchronous
    CUDA work is charged to the phase that queued it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str):
        synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.device)
            self.seconds[phase] += time.perf_counter() - start


class NoClock:
    """What the step uses when nobody is timing phases: no extra synchronisation."""

    def __call__(self, phase: str):
        return contextlib.nullcontext()


class TrainStep:
    def __init__(self, model: GPT, device: torch.device, precision: Precision, lr: float = 1e-3,
                 weight_decay: float = 0.1, grad_clip: float = 1.0):
        self.model, self.device, self.precision, self.grad_clip = model, device, precision, grad_clip
        self.optimizer = build_optimizer(model, lr, weight_decay, device_type=device.type)
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision.needs_grad_scaler)
        model.train()

    def __call__(self, next_batch, clock=NoClock()) -> float:
        with clock("data"):
            x, y = next_batch()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with clock("forward"):
            with self.precision.autocast():
                _, loss = self.model(x, y)
        with clock("backward"):
            self.scaler.scale(loss).backward()
        with clock("optimizer"):
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        with clock("other"):
            return float(loss.detach())


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA (and other accelerators) raise torch.OutOfMemoryError; CPU raises RuntimeError."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and CPU_ALLOCATION_FAILURE in str(error))


def release_memory(device: torch.device) -> None:
    """After an out-of-memory error: drop the failed step's tensors before reporting."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
