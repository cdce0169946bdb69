"""How much to prune after each round of an iterative run.

`cubic` is Zhu & Gupta's gradual schedule (2017, "To prune, or not to prune"),
s_k = s_f * (1 - (1 - k/K)^3): large cuts while there is plenty of redundancy,
small ones near the target.  `geometric` removes the same fraction of what is
left every round: s_k = 1 - (1 - s_f)^(k/K).  Both end exactly at the target.
"""
from __future__ import annotations

from prune.errors import PruneError

SCHEDULES = ("cubic", "geometric")


def sparsity_schedule(target: float, rounds: int, kind: str = "cubic") -> list[float]:
    """Sparsity to reach at the end of rounds 1..K (the last entry is `target` itself)."""
    if not 0 < target < 1:
        raise PruneError(f"target sparsity must be between 0 and 1 (exclusive), got {target}")
    if rounds < 1:
        raise PruneError(f"rounds must be at least 1, got {rounds}")
    if kind == "cubic":
        steps = [target * (1 - (1 - k / rounds) ** 3) for k in range(1, rounds)]
    elif kind == "geometric":
        steps = [1 - (1 - target) ** (k / rounds) for k in range(1, rounds)]
    else:
        raise PruneError(f"unknown schedule {kind!r}; choose one of {', '.join(SCHEDULES)}")
    return steps + [target]
