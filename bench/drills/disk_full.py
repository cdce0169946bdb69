"""Disk full during a save: train.py on a tmpfs with room for one checkpoint, not two (mounting it needs root,
on Linux); a failure is anything but one `error:` line naming ENOSPC and the last good checkpoint, which must
load.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from bench.drills.drill import Drill, DrillSettings, last_error_line, saved_step, train_command
from bench.processes import run_command
from storage.artifact import load_model


def run(s: DrillSettings, work: Path) -> Drill:
    disk = work / "full-disk"
    disk.mkdir()
    # Room for the tiny model's checkpoint (weights and Adam moments) once, not for staging a second beside it.
    mounted = run_command(["mount", "-t", "tmpfs", "-o", "size=150m", "tmpfs", str(disk)])
    if mounted.returncode:
        return Drill("disk full during a save", 0, 0, "-",
                     notes=[f"not run: mounting a small tmpfs failed ({last_error_line(mounted.stderr)}); needs root"])
    failures, notes = 0, []
    try:
        for trial in range(s.disk_full_runs):
            out = disk / f"run-{trial}"
            training = run_command(train_command(max_steps=4, checkpoint_interval=2, out_dir=str(out)))
            error = next((line for line in training.stderr.splitlines() if line.startswith("error:")), "no error line")
            try:
                intact = saved_step(out) == 2 and load_model(out)[1].step == 2
            except Exception as e:
                intact, error = False, f"{error}; the checkpoint does not load: {e}"
            ok = (training.returncode == 1 and "Traceback" not in training.stderr and "(ENOSPC)" in error
                  and "checkpoint of step 2" in error and intact)
            failures += not ok
            notes.append(f"trial {trial}: exit {training.returncode}, {'intact' if intact else 'NOT intact'}: {error}")
            shutil.rmtree(out, ignore_errors=True)
    finally:
        run_command(["umount", str(disk)])
    return Drill("disk full during a save", s.disk_full_runs, failures, "-", notes=notes[:2])
