"""A run folder's files, as every tool reads them: which checkpoint a tool means when given none, and what a
training checkpoint's state says.  train.py writes `training_state/` (training/checkpoint.py); the tools
that only load artifacts read it here, so none of them imports training/ or parallel/ to find a model.
"""
from __future__ import annotations

import json
from pathlib import Path

from model.artifact import DEFAULT_OUT_ROOT, artifact_folders
from model.hub import resolve_checkpoint
from model.weights import ArtifactError

TRAINING_STATE = "training_state"
STATE_FILE = f"{TRAINING_STATE}/state.json"
OPTIMIZER_FILE = f"{TRAINING_STATE}/optimizer.pt"


def is_training_checkpoint(folder: str | Path) -> bool:
    return (Path(folder) / TRAINING_STATE).exists()


def read_training_state(folder: str | Path) -> dict | None:
    """`state.json` of a training checkpoint, or None for any other artifact."""
    path = Path(folder) / STATE_FILE
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{path} is not valid JSON ({e}); the checkpoint is damaged") from e
    if not isinstance(state, dict):
        raise ArtifactError(f"{path} holds a {type(state).__name__}, not the training state; the checkpoint "
                            f"is damaged")
    return state


def trained_dataset(folder: str | Path) -> str | None:
    """The dataset a training checkpoint was trained on, when it records one."""
    state = read_training_state(folder) or {}
    return (state.get("train_config") or {}).get("dataset")


def trained_tokens(folder: Path) -> int:
    """Tokens the checkpoint's run has trained on (0 when its training state does not say)."""
    try:
        state = read_training_state(folder) or {}
        config = state["train_config"]
        block = config["block_size"] or json.loads((folder / "config.json").read_text())["model"]["block_size"]
        return int(state["step"]) * int(state["global_batch"]) * int(config["grad_accum"]) * int(block)
    except (ArtifactError, KeyError, TypeError, ValueError, OSError):
        return 0


def default_checkpoint(root: str | Path = DEFAULT_OUT_ROOT) -> tuple[Path, str]:
    """The model a tool run without --checkpoint means: of the checkpoints train.py wrote under `root`, the
    one trained on the most tokens (the newest among equals), not merely the newest folder (after
    `make demo` that would be its 20-step FSDP run).  Returns the folder and a sentence saying why."""
    runs = artifact_folders(root, accept=lambda meta: (meta.get("produced_by") or {}).get("tool") == "train.py")
    if not runs:
        raise ArtifactError(f"no checkpoint written by train.py found under {root}/; train one first "
                            f"(`python train.py`) or pass --checkpoint DIR")
    best = max(runs, key=lambda d: (trained_tokens(d), (d / "config.json").stat().st_mtime))
    return best, (f"the train.py checkpoint under {root}/ trained on the most tokens "
                  f"({trained_tokens(best):,} of {len(runs)} run{'s' if len(runs) > 1 else ''}); "
                  f"--checkpoint DIR picks another")


def pick_checkpoint(checkpoint: str | None, root: str | Path = DEFAULT_OUT_ROOT) -> tuple[Path, str]:
    """The folder a tool's --checkpoint names (a path or a hub name), or without one the default under
    `root`; and a phrase saying how it was chosen, for the tool to print."""
    if checkpoint:
        return resolve_checkpoint(checkpoint), "--checkpoint"
    return default_checkpoint(root)
