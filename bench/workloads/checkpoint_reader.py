"""A reader in its own process, for the readers-during-saves drill (bench/drills/readers_during_saves.py): loads the
checkpoint (config, weights and training state as one save) in a tight loop until the stop file appears, then
prints the number of reads and the first errors as JSON.

    python -m bench.workloads.checkpoint_reader FOLDER STOP_FILE
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from storage.artifact import load_model
from storage.folder import reading
from storage.training_state import TrainingState
from storage.weights import ArtifactError


def read_until(folder: Path, stop: Path) -> dict:
    reads, errors = 0, []
    while not stop.exists():
        try:
            with reading(folder):
                meta = load_model(folder)[1]
                state = TrainingState.read(folder)
            if state.step != meta.step:
                errors.append(f"config.json of step {meta.step} beside state.json of step {state.step}")
            reads += 1
        except ArtifactError as e:  # before the first save there is nothing to read
            if reads or not any(m in str(e) for m in ("has no config.json", "does not exist", "no such folder")):
                errors.append(str(e))
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
    return {"reads": reads, "errors": errors[:5]}


if __name__ == "__main__":
    print(json.dumps(read_until(Path(sys.argv[1]), Path(sys.argv[2]))))
