"""A short fine-tune after each pruning round, with the pruning masks enforced at every step."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from data.loader import WindowSampler
from model.gpt import GPT
from training.optim import lr_at
from prune.masks import MaskSet
from runtime.device import Precision
from runtime.errors import UserError
from runtime.progress import ProgressBar
from training.step import NonFiniteStep, TrainStep


@dataclass(frozen=True)
class FinetuneSettings:
    steps: int
    lr: float
    weight_decay: float
    warmup_steps: int
    grad_clip: float = 1.0


class FinetuneError(UserError):
    pass


def finetune(model: GPT, sampler: WindowSampler, settings: FinetuneSettings, device: torch.device,
             precision: Precision, masks: MaskSet | None = None, desc: str = "fine-tune",
             on_first_step: Callable[[float], None] | None = None) -> float | None:
    """Train `model` in place for `settings.steps` steps of train.py's step; returns the last training loss
    (None for 0 steps).  `on_first_step` is told the first step's seconds (for the run's estimate).

    A fresh AdamW each call: after row pruning the parameters are new tensors, and for masked
    pruning fresh moments mean a pruned weight never carries momentum from before it was cut.
    """
    if settings.steps == 0:
        return None
    step = TrainStep.single_device(model, device, precision, settings.lr, settings.weight_decay, settings.grad_clip,
                                   masks)
    warmup = min(settings.warmup_steps, settings.steps)
    result = None
    with ProgressBar(range(settings.steps), desc=desc, unit="step", leave=False) as bar:
        for i in bar:
            start = time.perf_counter()
            try:
                result = step(sampler.next_batch, lr_at(i, settings.lr, warmup, settings.steps))
            except NonFiniteStep as e:
                raise FinetuneError(f"fine-tuning {e}; lower --lr") from e
            if i == 0 and on_first_step is not None:
                on_first_step(time.perf_counter() - start)
            bar.set_postfix(loss=f"{result.loss:.3f}")
    model.eval()
    return result.loss
