"""A training run's checkpoint: where it is saved, and how it is resumed.

Where.  In the run folder, `--out-dir` (default `out/train`), which is also an ordinary float artifact that every
tool loads:

    out/train/
        config.json                  the model config, the artifact kind, provenance and the step saved
        model.safetensors            the weights, consolidated under the single-device names
        training_state/state.json    step, data position, RNG, the global batch, the layout and the TrainConfig
        training_state/optimizer.pt  the optimizer state by parameter name, full tensors
        metrics.jsonl, curves.png    the run's log (training/metrics.py), not part of a save
        .writer .swap .gate          the folder's locks; .staging/ while a save is written (storage/folder.py)

Each save replaces all four checkpoint files at once, so the folder holds the latest checkpoint only.

When.  Every `--checkpoint-interval` steps (by default `--eval-interval`), when `--checkpoint-minutes` have passed
since the last save, at the last step, and on a stop signal (the last whole step, unless a save takes longer than
the grace left).  The trainer first checks that the weights still give a finite validation loss
(training/trainer.py, `check_savable`), and the checkpointer refuses any non-finite tensor, so a save never
replaces the last good checkpoint with a bad one.

How.  Every rank gathers the state (`gather.py`: each DTensor or tensor-parallel shard gathered to its full
tensor under its single-device name, one tensor at a time) and rank 0 alone writes it, through storage/:
storage/artifact.py's writers and `write_folder_atomically` (storage/folder.py: staged, journalled, moved into
place under the swap lock, so a reader or a crash sees the previous save or the whole new one).  Rank 0 holds the
folder's writer lock from `Checkpointer.open` to `close`, so a second run in the same folder is refused; the
claim (storage/claim.py) is the one place `--overwrite` deletes.  training/ decides what is saved and when;
storage/ decides how bytes reach the disk.

Resumed.  With `--resume` (or `--resume auto` finding a run), `Checkpointer.open` reads `state.json`
(storage/training_state.py) and `resume.py` settles the run's settings: the saved ones, except the launch's (device,
layout, ...) and the few a run may change on the way.  `saved_model` loads the full weights on the CPU before the
model is parallelised, so any layout slices them; `load` shards the optimizer state back for this layout
(`gather.load_optimizer_state`), restores the data sampler's position and the RNG, and returns the step to start
from.  A damaged file is one error line naming it.

    checkpointer.py  Checkpointer: claim, due, save, load, release; the folder's claim for a new or resumed run
    resume.py        which settings a resumed run takes from the checkpoint and which from the command line
    gather.py        state consolidated across layouts for a save, and sharded back on resume
"""
from training.checkpoint.checkpointer import Checkpointer, load_init_model

__all__ = ["Checkpointer", "load_init_model"]
