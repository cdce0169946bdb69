"""A run folder, as every tool reads it: which checkpoint a tool means when given none (`pick_checkpoint`,
the one default-checkpoint policy), and what a training checkpoint says about its run.  train.py writes
`training_state/` through storage/training_state.py; the tools that only load artifacts read it here, so
none of them imports training/ or parallel/ to find a model.
"""
from __future__ import annotations

from pathlib import Path

from storage.artifact import DEFAULT_OUT_ROOT, artifact_folders, read_meta
from storage.hub import resolve_checkpoint
from storage.meta import CONFIG_FILE
from storage.training_state import TRAINING_STATE, TrainingState
from storage.weights import ArtifactError

# The tool named in a training checkpoint's provenance: what train.py writes and the default checkpoint is.
TRAINING_TOOL = "train.py"


def is_training_checkpoint(folder: str | Path) -> bool:
    return (Path(folder) / TRAINING_STATE).exists()


def trained_dataset(folder: str | Path) -> str | None:
    """The dataset a training checkpoint was trained on, when it records one."""
    state = TrainingState.read(folder)
    dataset = state.train_config.get("dataset") if state else None
    return dataset if isinstance(dataset, str) else None


def trained_tokens(folder: Path) -> int:
    """Tokens the checkpoint's run has trained on (0 when its training state cannot say)."""
    try:
        state = TrainingState.read(folder)
        if state is None:
            return 0
        return state.tokens(int(state.train_config.get("block_size") or read_meta(folder).model.block_size))
    except (ArtifactError, TypeError, ValueError, OSError):
        return 0


def default_checkpoint(root: str | Path = DEFAULT_OUT_ROOT) -> tuple[Path, str]:
    """The model a tool run without --checkpoint means: of the checkpoints train.py wrote under `root`, the
    one trained on the most tokens (the newest among equals), not merely the newest folder (after
    `make demo` that would be its 20-step FSDP run).  Returns the folder and a sentence saying why."""
    runs = artifact_folders(root, accept=lambda meta: meta.produced_by.tool == TRAINING_TOOL)
    if not runs:
        raise ArtifactError(f"no checkpoint written by train.py found under {root}/; train one first "
                            f"(`python train.py`) or pass --checkpoint DIR")
    tokens = {run: trained_tokens(run) for run in runs}
    best = max(runs, key=lambda d: (tokens[d], (d / CONFIG_FILE).stat().st_mtime))
    return best, (f"the train.py checkpoint under {root}/ trained on the most tokens "
                  f"({tokens[best]:,} of {len(runs)} run{'s' if len(runs) > 1 else ''}); "
                  f"--checkpoint DIR picks another")


def pick_checkpoint(checkpoint: str | None, root: str | Path = DEFAULT_OUT_ROOT) -> tuple[Path, str]:
    """The folder a tool's --checkpoint names (a path or a hub name), or without one the default under
    `root`; and a phrase saying how it was chosen, for the tool to print."""
    if checkpoint:
        return resolve_checkpoint(checkpoint, "--checkpoint"), "--checkpoint"
    return default_checkpoint(root)
