"""The data a checkpoint was trained (or last pruned) on, for pruning's fine-tunes and evaluations."""
from __future__ import annotations

from pathlib import Path

from storage.meta import ArtifactMeta
from storage.run_folder import trained_dataset

DEFAULT_DATASET = "builtin"


def checkpoint_dataset(folder: Path, meta: ArtifactMeta) -> str | None:
    """The dataset the checkpoint was trained (or last pruned) on, when it records one."""
    return trained_dataset(folder) or (meta.pruning or {}).get("dataset")


def resolve_dataset(requested: str | None, folder: Path, meta: ArtifactMeta) -> str:
    """--dataset if given, else the checkpoint's own, else the builtin one; says which and why."""
    if requested:
        print(f"dataset {requested} (from --dataset)")
        return requested
    dataset = checkpoint_dataset(folder, meta)
    if dataset:
        print(f"dataset {dataset} (the checkpoint's training dataset)")
        return dataset
    print(f"note: {folder} does not record its training dataset; fine-tuning and evaluating on {DEFAULT_DATASET!r}. "
          f"Pass --dataset NAME if it was trained on something else.")
    return DEFAULT_DATASET
