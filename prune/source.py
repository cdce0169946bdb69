"""The data a checkpoint was trained (or last pruned) on, for pruning's fine-tunes and evaluations."""
from __future__ import annotations

from model.run_folder import trained_dataset
from pathlib import Path



def checkpoint_dataset(folder: Path, meta: dict) -> str | None:
    """The dataset the checkpoint was trained (or last pruned) on, when it records one."""
    return trained_dataset(folder) or (meta.get("pruning") or {}).get("dataset")
