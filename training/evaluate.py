"""Mean cross-entropy over every target token of a set of batches (padding targets are -1)."""
from __future__ import annotations

import contextlib
import math
from typing import Iterable

import torch


@torch.no_grad()
def evaluate_loss(model: torch.nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                  device, autocast=None) -> dict:
    """Token-weighted mean loss and perplexity; the model's train/eval mode is restored afterwards."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:  # `batches` may stop the evaluation midway (a stop signal): the mode is restored either way
        for x, y in batches:
            x, y = x.to(device), y.to(device)
            with autocast() if autocast else contextlib.nullcontext():
                loss = model(x, y)[1]  # the logits are dropped before the next batch makes its own
            n = int((y != -1).sum())
            total += float(loss) * n
            count += n
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("evaluation received no target tokens")
    mean = total / count
    return {"val_loss": mean, "val_ppl": math.exp(min(mean, 50.0)), "val_tokens": count}

