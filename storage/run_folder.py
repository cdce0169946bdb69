"""A run folder, as every tool reads it: which checkpoint a tool means when given none (`pick_checkpoint`,
the one default-checkpoint policy), and what a training checkpoint says about its run.  train.py writes
`training_state/` through storage/training_state.py; the tools that only load artifacts read it here, so
none of them imports training/ or parallel/ to find a model.

The tools that measure a model (quantize/, prune/, bench/eval/perplexity.py, bench/leaderboard.py) measure it on
the data and at the context it was trained on unless told otherwise: `evaluation_dataset` and `evaluation_context`
are that one rule, read from the run's record by `trained_on`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from storage.artifact import DEFAULT_OUT_ROOT, artifact_folders, read_meta
from storage.hub import resolve_checkpoint
from storage.meta import CONFIG_FILE
from storage.training_state import STATE_FILE, TRAINING_STATE, TrainingState
from storage.weights import ArtifactError

# The tool named in a training checkpoint's provenance: what train.py writes and the default checkpoint is.
TRAINING_TOOL = "train.py"


def is_training_checkpoint(folder: str | Path) -> bool:
    return (Path(folder) / TRAINING_STATE).exists()


@dataclass(frozen=True)
class TrainedOn:
    """What an artifact's model was trained on, as far as its folder (or its sources') records it."""
    dataset: str | None = None
    dataset_record: Path | None = None  # the file that names the dataset
    block_size: int | None = None  # the run's --block-size; None where it trained on the model's whole context
    block_record: Path | None = None


def trained_on(folder: str | Path) -> TrainedOn:
    """A training checkpoint's dataset and block size, from its training_state/state.json.  An artifact made from
    another (int8 or pruned: the source its config.json's provenance names) has its source's, except that a pruned
    artifact was last fine-tuned on the dataset its own config.json names.  A Hugging Face model records neither.
    A record that cannot be read (moved, damaged) ends the search: the tool then says it falls back."""
    dataset = dataset_record = None
    seen, current = set(), Path(folder)
    while current.is_dir() and current.resolve() not in seen:
        seen.add(current.resolve())
        try:
            state = TrainingState.read(current)
            meta = None if state else read_meta(current)
        except (ArtifactError, OSError):
            break
        if state:
            named, block = state.train_config.get("dataset"), state.train_config.get("block_size")
            if dataset is None and isinstance(named, str):
                dataset, dataset_record = named, current / STATE_FILE
            block_size = block if type(block) is int and block > 0 else None
            return TrainedOn(dataset, dataset_record, block_size, current / STATE_FILE if block_size else None)
        named = (meta.pruning or {}).get("dataset")
        if dataset is None and isinstance(named, str):
            dataset, dataset_record = named, current / CONFIG_FILE
        if not meta.produced_by.source:
            break
        current = Path(meta.produced_by.source)
    return TrainedOn(dataset, dataset_record)


def evaluation_dataset(requested: str | None, folder: Path, default: str) -> tuple[str, str]:
    """The dataset a tool measures `folder`'s model on: --dataset if given, else the one the model was trained
    on, else the tool's `default`; with a phrase saying why, for the tool's first line."""
    if requested:
        return requested, "from --dataset"
    record = trained_on(folder)
    if record.dataset:
        return record.dataset, f"the checkpoint's training dataset, recorded in {record.dataset_record}"
    return default, (f"the default: {folder} records no training dataset; pass --dataset if it was trained on "
                     f"another")


def evaluation_context(requested: int | None, flag: str, folder: Path, model_context: int) -> tuple[int, str | None]:
    """The window a tool evaluates `folder`'s model with: `requested` (the tool's `flag`), else the block size it
    was trained at, else its whole context; and a warning when the window reaches positions never trained, whose
    loss says nothing of the model (a sliding window that reaches them scores worse than one that does not)."""
    record = trained_on(folder)
    trained = min(record.block_size or model_context, model_context)
    context = requested or trained
    if context <= trained:
        return context, None
    return context, (f"warning: {flag} {context} reaches positions the model was never trained at: it was trained "
                     f"with --block-size {trained} (recorded in {record.block_record}); positions past {trained} "
                     f"score worse")


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
