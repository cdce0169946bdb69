"""The data a checkpoint was trained (or last pruned) on, for pruning's fine-tunes and evaluations."""
from __future__ import annotations

from pathlib import Path

from training.checkpoint import trained_dataset


def checkpoint_dataset(folder: Path, meta: dict) -> str | None:
    """The dataset the checkpoint was trained (or last pruned) on, when it records one."""
    return trained_dataset(folder) or (meta.get("pruning") or {}).get("dataset")
