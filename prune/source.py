"""What to prune when the user names nothing: the newest training checkpoint, and the data it was trained on."""
from __future__ import annotations

from pathlib import Path

from model.artifact import DEFAULT_OUT_ROOT, find_latest_artifact
from training.checkpoint import trained_dataset


def find_training_checkpoint(root: str | Path = DEFAULT_OUT_ROOT) -> Path:
    """The newest artifact under `root` that train.py wrote (pruned and quantized outputs are skipped)."""
    return find_latest_artifact(root, accept=lambda meta: (meta.get("produced_by") or {}).get("tool") == "train.py",
                                what="checkpoint written by train.py")


def checkpoint_dataset(folder: Path, meta: dict) -> str | None:
    """The dataset the checkpoint was trained (or last pruned) on, when it records one."""
    return trained_dataset(folder) or (meta.get("pruning") or {}).get("dataset")
