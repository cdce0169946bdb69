"""A short fine-tune after each pruning round, with the pruning masks enforced at every step."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tqdm import tqdm

from data.loader import WindowSampler
from model.gpt import GPT
from model.optim import build_optimizer, lr_at
from prune.masks import MaskSet
from runtime.device import Precision


@dataclass(frozen=True)
class FinetuneSettings:
    steps: int
    lr: float
    weight_decay: float
    warmup_steps: int
    grad_clip: float = 1.0


class FinetuneError(RuntimeError):
    pass


def finetune(model: GPT, sampler: WindowSampler, settings: FinetuneSettings, device: torch.device,
             precision: Precision, masks: MaskSet | None = None, desc: str = "fine-tune") -> float | None:
    """Train `model` in place for `settings.steps` steps; returns the last training loss (None for 0 steps).

    A fresh AdamW each call: after row pruning the parameters are new tensors, and for masked
    pruning fresh moments mean a pruned weight never carries momentum from before it was cut.
    """
    if settings.steps == 0:
        return None
    optimizer = build_optimizer(model, settings.lr, settings.weight_decay, device_type=device.type)
    scaler = torch.amp.GradScaler(device.type, enabled=precision.needs_grad_scaler)
    warmup = min(settings.warmup_steps, settings.steps)
    model.train()
    loss_value = None
    with tqdm(range(settings.steps), desc=desc, unit="step", leave=False) as bar:
        for step in bar:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, settings.lr, warmup, settings.steps)
            x, y = sampler.next_batch()
            with precision.autocast():
                _, loss = model(x.to(device), y.to(device))
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            if masks is not None:
                masks.mask_gradients()
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if masks is not None:
                masks.apply()
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value):
                raise FinetuneError(f"fine-tuning loss became {loss_value} at step {step + 1}; lower --lr")
            bar.set_postfix(loss=f"{loss_value:.3f}")
    model.eval()
    return loss_value
