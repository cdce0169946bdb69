"""What to prune when the user names nothing: the newest training checkpoint, and the data it was trained on."""
from __future__ import annotations

import json
from pathlib import Path

from model.artifact import DEFAULT_OUT_ROOT, find_latest_artifact


def find_training_checkpoint(root: str | Path = DEFAULT_OUT_ROOT) -> Path:
    """The newest artifact under `root` that train.py wrote (pruned and quantized outputs are skipped)."""
    return find_latest_artifact(root, accept=lambda meta: (meta.get("produced_by") or {}).get("tool") == "train.py",
                                what="checkpoint written by train.py")


def checkpoint_dataset(folder: Path, meta: dict) -> str | None:
    """The dataset the checkpoint was trained (or last pruned) on, when it records one."""
    state = Path(folder) / "training_state" / "state.json"
    if state.exists():
        dataset = json.loads(state.read_text()).get("train_config", {}).get("dataset")
        if dataset:
            return dataset
    return (meta.get("pruning") or {}).get("dataset")
