"""A training checkpoint's `training_state/state.json`, typed: `TrainingState` is the one reader and writer of
that file (train.py's checkpointer writes it, the resume and the tools that pick a default checkpoint read it).

Every field is checked when read: counts are counts, the RNG is bytes, the sections are objects.  A damaged
file is one error naming the file, the field and the fix.  `train_config` stays a plain object here: its
fields are the training config's (training/config.py), which checks them when a run resumes.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from storage.meta import json_kind
from storage.weights import ArtifactError, one_line
from runtime.parsed import Unparsable, json_value

TRAINING_STATE = "training_state"
STATE_FILE = f"{TRAINING_STATE}/state.json"
OPTIMIZER_FILE = f"{TRAINING_STATE}/optimizer.pt"
FIX = "the checkpoint is damaged; resume from another checkpoint or start a new run with another --out-dir"


@dataclass
class TrainingState:
    step: int  # updates applied
    sampler: dict  # the data position (data/loader.py's WindowSampler.state_dict)
    global_batch: int | None  # sequences per step across data-parallel ranks (None: older checkpoints)
    train_config: dict  # the run's TrainConfig fields
    torch_rng: list[int]
    cuda_rng: list[list[int]] = dataclasses.field(default_factory=list)
    parallel: dict = dataclasses.field(default_factory=dict)  # the layout that wrote it, for the record

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self)))

    def tokens(self, block_size: int) -> int:
        """Tokens the run has trained on, with `block_size` the run's sequence length."""
        return self.step * (self.global_batch or 0) * int(self.train_config.get("grad_accum", 1)) * block_size

    @classmethod
    def read(cls, folder: str | Path) -> "TrainingState | None":
        """The folder's training state, or None for an artifact that is not a training checkpoint."""
        path = Path(folder) / STATE_FILE
        if not path.exists():
            return None
        try:
            data = json_value(path.read_bytes())
        except Unparsable as e:
            raise ArtifactError(f"{path} is not readable JSON ({one_line(e)}); {FIX}") from e
        if not isinstance(data, dict):
            raise ArtifactError(f"{path} holds a JSON {json_kind(data)}, not the training state; {FIX}")
        return cls.from_dict(data, path)

    @classmethod
    def from_dict(cls, data: dict, path: Path) -> "TrainingState":
        def field(name, valid, what, required=True):
            if name not in data:
                if required:
                    raise ArtifactError(f"{path} has no \"{name}\"; {FIX}")
                return None
            value = data[name]
            if not valid(value):
                raise ArtifactError(f"{path}: \"{name}\" is {str(value)[:80]!r}, not {what}; {FIX}")
            return value

        def count(minimum):
            return lambda v: type(v) is int and v >= minimum

        def rng(v):
            return isinstance(v, list) and all(type(b) is int and 0 <= b < 256 for b in v)

        return cls(step=field("step", count(0), "a count of steps"),
                   sampler=field("sampler", lambda v: isinstance(v, dict), "an object"),
                   global_batch=field("global_batch", count(1), "a count of sequences", required=False),
                   train_config=field("train_config", lambda v: isinstance(v, dict), "an object"),
                   torch_rng=field("torch_rng", rng, "a list of bytes"),
                   cuda_rng=field("cuda_rng", lambda v: isinstance(v, list) and all(rng(s) for s in v),
                                  "a list of lists of bytes", required=False) or [],
                   parallel=field("parallel", lambda v: isinstance(v, dict), "an object", required=False) or {})
