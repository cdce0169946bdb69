"""AdamW with decay / no-decay groups, a cosine schedule with linear warmup (as GPT-2 / nanoGPT), and the peak
learning rate for a larger global batch (Goyal et al. 2017: linear scaling with warmup; Krizhevsky 2014 / Hoffer et
al. 2017: square-root scaling, gentler for adaptive optimizers)."""
from __future__ import annotations

import math

import torch


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float,
                    betas=(0.9, 0.95)) -> torch.optim.AdamW:
    """Matrices (linear weights, embeddings) decay; biases and LayerNorm gains do not."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # The fused kernel (one pass over each tensor, CPU and CUDA alike) beats the default
    # per-parameter loop on CPU; see bench/experiments/train_speed.py.
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)


def lr_at(step: int, max_lr: float, warmup_steps: int, max_steps: int, min_lr_ratio: float = 0.1) -> float:
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return max_lr * min_lr_ratio
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return max_lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


LR_SCALING_RULES = ("none", "linear", "sqrt")


def scaled_lr(lr: float, global_batch: int, reference_batch: int, rule: str) -> float:
    """`lr` was tuned for `reference_batch` sequences per step; return it for `global_batch` (`rule` and the batches
    are checked by TrainConfig, from --scale-lr and --reference-batch)."""
    ratio = global_batch / reference_batch
    return lr if rule == "none" else lr * (ratio if rule == "linear" else math.sqrt(ratio))
