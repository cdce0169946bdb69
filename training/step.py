"""The one training step: train.py, the pruning fine-tunes and every benchmark call it.

One optimizer step is `grad_accum` micro-batches of forward, loss and (scaled) backward, then the
data-parallel strategy's gradient synchronisation, unscaling, clipping of the global gradient norm,
and the optimizer update.  A non-finite loss or gradient norm stops the step with the weights and
optimizer state untouched, so a poisoned update can never reach a checkpoint.  Where the optimizer is
fused AdamW over plain tensors (one device, DDP) that check is made on the device: the fused kernel
skips every tensor when told the step is not finite, so the update is launched before the loss and the
norm are read back, and the host's work on the update overlaps the device's backward instead of
leaving the device idle between steps.  Elsewhere they are read with one synchronisation before the
update.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from training.optim import build_optimizer
from parallel import CommsMeter, DistContext, SingleDevice
from parallel.local_state import is_dtensor
from runtime.device import Precision
from runtime.errors import UserError
from training.metrics import NO_CLOCK

Batch = tuple[torch.Tensor, torch.Tensor]


class NonFiniteStep(UserError):
    """The loss or the gradient norm was NaN or infinite; the update was not applied."""

    def __init__(self, loss: float, grad_norm: float, message: str):
        super().__init__(message)
        self.loss, self.grad_norm = loss, grad_norm


class GradientMasks(Protocol):
    """Pruning masks: pruned weights get no gradient and are re-zeroed after the update."""

    def mask_gradients(self) -> None: ...

    def apply(self) -> None: ...


@dataclass(frozen=True)
class StepResult:
    loss: float  # mean over micro-batches and data-parallel ranks
    grad_norm: float  # before clipping


class TrainStep:
    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, strategy, device: torch.device,
                 precision: Precision, grad_accum: int = 1, grad_clip: float = 1.0,
                 masks: GradientMasks | None = None, read_before_update: bool = False):
        """`module` runs forward and backward (the wrapped or compiled model); `strategy` is the
        data-parallel strategy (`parallel.SingleDevice(model)` on one device).  `read_before_update` keeps
        the loss and norm read before the update is launched even where the device could check them (the
        order before the device check, which bench/standalone/train_step_profile.py times against it)."""
        self.module, self.optimizer, self.strategy = module, optimizer, strategy
        self.device, self.precision = device, precision
        self.grad_accum, self.grad_clip, self.masks = grad_accum, grad_clip, masks
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision.needs_grad_scaler)
        # fp16's scaler already hands the fused kernel its own skip flag; DTensor parameters (FSDP, TP) would
        # need the flag as a DTensor too.
        self.checks_on_device = (not read_before_update and not self.scaler.is_enabled()
                                 and bool(optimizer.defaults.get("fused"))
                                 and not any(is_dtensor(p) for g in optimizer.param_groups for p in g["params"]))
        self.steps_taken = 0  # by this object; the trainer sets it when it resumes

    @classmethod
    def single_device(cls, model: torch.nn.Module, device: torch.device, precision: Precision, lr: float = 1e-3,
                      weight_decay: float = 0.1, grad_clip: float = 1.0, masks: GradientMasks | None = None):
        """The step of a one-device run with train.py's optimizer (pruning fine-tunes, benchmarks)."""
        model.train()
        optimizer = build_optimizer(model, lr, weight_decay)
        return cls(model, optimizer, SingleDevice(model, DistContext(device=device), CommsMeter()), device,
                   precision, grad_clip=grad_clip, masks=masks)

    def __call__(self, next_batch: Callable[[], Batch], lr: float | None = None, clock=NO_CLOCK,
                 after_micro_batch: Callable[[int], None] | None = None) -> StepResult:
        """One optimizer step at learning rate `lr` (None: the optimizer's current one).  `after_micro_batch(i)`
        runs after each micro-batch's backward; if it raises (a stop signal), the step's partial gradients are
        dropped and the weights and optimizer state stay those of the previous step."""
        for group in self.optimizer.param_groups:
            group["lr"] = group["lr"] if lr is None else lr
        try:
            loss_sum = self.accumulate(next_batch, clock, after_micro_batch)
        except BaseException:
            self.optimizer.zero_grad(set_to_none=True)
            raise
        return self.update(loss_sum, clock)

    def accumulate(self, next_batch: Callable[[], Batch], clock, after_micro_batch) -> torch.Tensor:
        """Forward and backward over the step's micro-batches; returns the sum of their scaled losses."""
        loss_sum = None
        for micro in range(self.grad_accum):
            with clock("data"):
                x, y = (t.to(self.device, non_blocking=True) for t in next_batch())
            with self.strategy.gradient_sync(micro == self.grad_accum - 1):
                with clock("forward"), self.precision.autocast():
                    # Only the loss is kept: holding the logits would keep a (batch, block, vocab) tensor
                    # alive through backward.
                    loss = self.module(x, y)[1] / self.grad_accum
                with clock("backward"):
                    self.scaler.scale(loss).backward()
            self.strategy.after_backward(time.perf_counter())
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
            if after_micro_batch is not None:
                after_micro_batch(micro)
        return loss_sum

    def update(self, loss_sum: torch.Tensor, clock) -> StepResult:
        """Synchronise, clip and apply the accumulated gradients (refused, untouched, if not finite)."""
        with clock("optimizer"):
            self.strategy.sync_gradients()
            self.scaler.unscale_(self.optimizer)
            if self.masks is not None:
                self.masks.mask_gradients()
            grad_norm = self.strategy.clip_grad_norm(self.grad_clip)
            loss_mean = self.strategy.mean_over_data_parallel(loss_sum)
            read_back = torch.stack([loss_mean.float(), grad_norm.float().to(self.device)])
            if self.checks_on_device:
                self.step_unless_not_finite(read_back)
            loss_value, norm_value = read_back.tolist()
            # Under fp16 the scaler skips steps with infinite gradients itself; anywhere else they are fatal.
            if not math.isfinite(loss_value) or (not math.isfinite(norm_value) and not self.scaler.is_enabled()):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteStep(loss_value, norm_value, f"loss became {loss_value} (gradient norm "
                                                            f"{norm_value}) at step {self.steps_taken + 1}, before its "
                                                            f"update (not applied)")
            if not self.checks_on_device:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            if self.masks is not None:
                self.masks.apply()
        self.steps_taken += 1
        return StepResult(loss_value, norm_value)

    def step_unless_not_finite(self, loss_and_norm: torch.Tensor) -> None:
        """Launch the fused update with its skip flag set on the device when the loss or the norm is not finite:
        the kernel then leaves every weight and moment as it was and takes its step count back (torch's
        `_fused_adamw` reads `found_inf`, the flag GradScaler hands it under fp16)."""
        self.optimizer.found_inf = (~torch.isfinite(loss_and_norm).all()).float()
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf
