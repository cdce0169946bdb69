"""What to prune when the user names nothing: the newest training checkpoint, and the data it was trained on."""
from __future__ import annotations

import json
from pathlib import Path

from model.artifact import CONFIG_FILE, DEFAULT_OUT_ROOT, STAGING_DIR, ArtifactError


def find_training_checkpoint(root: str | Path = DEFAULT_OUT_ROOT) -> Path:
    """The newest artifact under `root` that train.py wrote (pruned and quantized outputs are skipped)."""
    candidates = []
    for path in Path(root).rglob(CONFIG_FILE):
        if STAGING_DIR in path.parts:
            continue
        try:
            meta = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # not an artifact this search can use; an explicit --checkpoint reports the damage
        if isinstance(meta, dict) and (meta.get("produced_by") or {}).get("tool") == "train.py":
            candidates.append(path.parent)
    if not candidates:
        raise ArtifactError(f"no checkpoint written by train.py under {root}/; train one first (`python train.py`) "
                            f"or pass --checkpoint DIR")
    return max(candidates, key=lambda d: (d / CONFIG_FILE).stat().st_mtime)


def checkpoint_dataset(folder: Path, meta: dict) -> str | None:
    """The dataset the checkpoint was trained (or last pruned) on, when it records one."""
    state = Path(folder) / "training_state" / "state.json"
    if state.exists():
        dataset = json.loads(state.read_text()).get("train_config", {}).get("dataset")
        if dataset:
            return dataset
    return (meta.get("pruning") or {}).get("dataset")
