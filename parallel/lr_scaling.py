"""Learning rate for a larger global batch (Goyal et al. 2017: linear scaling with warmup;
Krizhevsky 2014 / Hoffer et al. 2017: square-root scaling, gentler for adaptive optimizers)."""
from __future__ import annotations

import math

from parallel.errors import ParallelError

RULES = ("none", "linear", "sqrt")


def scaled_lr(lr: float, global_batch: int, reference_batch: int, rule: str) -> float:
    """`lr` was tuned for `reference_batch` sequences per step; return it for `global_batch`."""
    if rule not in RULES:
        raise ParallelError(f"unknown --scale-lr {rule!r}; choose one of {', '.join(RULES)}")
    if reference_batch < 1:
        raise ParallelError(f"--reference-batch must be at least 1, got {reference_batch}")
    ratio = global_batch / reference_batch
    return lr if rule == "none" else lr * (ratio if rule == "linear" else math.sqrt(ratio))
