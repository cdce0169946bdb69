"""Readers during saves: train.py saves every step while other processes load the checkpoint in a tight loop
(config, weights and training state read as one save: bench/workloads/checkpoint_reader.py); a failure is a read that errs or mixes two saves, or a
training run that does not finish.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.drills.drill import Drill, DrillSettings, last_error_line, saved_step, steps, train_command
from bench.processes import INHERIT, run_command, start


def run(s: DrillSettings, work: Path) -> Drill:
    out, stop = work / "readers", work / "readers.stop"
    readers = [start([sys.executable, "-m", "bench.workloads.checkpoint_reader", str(out), str(stop)], stderr=INHERIT)
               for _ in range(s.readers)]
    training = run_command(train_command(max_steps=s.reader_steps, checkpoint_interval=1, out_dir=str(out)))
    stop.touch()
    reports = [json.loads(r.finish(timeout_s=120).stdout) for r in readers]
    errors = [e for r in reports for e in r["errors"]]
    notes = errors[:3]
    if training.returncode:
        notes.append(f"training failed: {last_error_line(training.stderr)}")
    lost = s.reader_steps - saved_step(out)
    return Drill("readers during saves", sum(r["reads"] for r in reports), len(errors) + (training.returncode != 0),
                 steps(lost), notes=notes)
