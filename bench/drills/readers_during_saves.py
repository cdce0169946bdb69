"""Readers during saves: train.py saves every step while other processes load the checkpoint in a tight loop
(config, weights and training state read as one save); a failure is a read that errs or mixes two saves, or a
training run that does not finish.
"""
from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

from bench.drills.drill import Drill, DrillSettings, last_error_line, saved_step, steps, train_command
from bench.processes import INHERIT, run_command, start


# A reader in its own process: load the checkpoint (config, weights, training state as one save) until
# the stop file appears; print the number of reads and the first errors as JSON.
READER = textwrap.dedent("""
    import json, pathlib, sys
    from storage.artifact import load_model
    from storage.folder import reading
    from storage.training_state import TrainingState
    from storage.weights import ArtifactError
    folder, stop = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    reads, errors = 0, []
    while not stop.exists():
        try:
            with reading(folder):
                model, meta = load_model(folder)
                state = TrainingState.read(folder)
            if state.step != meta.step:
                errors.append(f"config.json of step {meta.step} beside state.json of step {state.step}")
            reads += 1
        except ArtifactError as e:  # before the first save there is nothing to read
            if reads or "has no config.json" not in str(e) and "does not exist" not in str(e):
                errors.append(str(e))
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
    print(json.dumps({"reads": reads, "errors": errors[:5]}))
""")


def run(s: DrillSettings, work: Path) -> Drill:
    out, stop = work / "readers", work / "readers.stop"
    started = time.perf_counter()
    readers = [start([sys.executable, "-c", READER, str(out), str(stop)], stderr=INHERIT) for _ in range(s.readers)]
    training = run_command(train_command(max_steps=s.reader_steps, checkpoint_interval=1, out_dir=str(out)))
    stop.touch()
    reports = [json.loads(r.finish(timeout_s=120).stdout) for r in readers]
    errors = [e for r in reports for e in r["errors"]]
    notes = errors[:3]
    if training.returncode:
        notes.append(f"training failed: {last_error_line(training.stderr)}")
    lost = s.reader_steps - saved_step(out)
    return Drill("readers during saves", sum(r["reads"] for r in reports), len(errors) + (training.returncode != 0),
                 steps(lost), time.perf_counter() - started, notes)
