"""The data pruning fine-tunes and evaluates on: storage's one rule (the checkpoint's own), said prune's way."""
from __future__ import annotations

from pathlib import Path

from storage.run_folder import evaluation_dataset

DEFAULT_DATASET = "builtin"


def resolve_dataset(requested: str | None, folder: Path) -> str:
    """--dataset if given, else the checkpoint's own, else the builtin one; says which and why."""
    dataset, why = evaluation_dataset(requested, folder, DEFAULT_DATASET)
    print(f"dataset {dataset} ({why})")
    return dataset
