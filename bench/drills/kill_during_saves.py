"""kill -9 during saves: train.py, saving every step, is killed at a random moment up to 0.1 s after a save
begins, then resumed to the end; a failure is a resume that errs or a final loss that differs from an
uninterrupted run's.  Work lost: the steps trained after the last checkpoint.
"""
from __future__ import annotations

import random
import signal
import time
from pathlib import Path

from bench.drills.drill import (Drill, DrillSettings, last_error_line, logged_losses, resumed_step, saved_step, steps,
                                train_command)
from bench.experiment import ExperimentError
from bench.processes import DEVNULL, run_command, start
from storage.folder import STAGING_DIR


def run(s: DrillSettings, work: Path) -> Drill:
    rng = random.Random(s.seed)
    reference = work / "kill-reference"
    done = run_command(train_command(max_steps=s.kill_steps, checkpoint_interval=1000, out_dir=str(reference)))
    if not done.ok:
        raise ExperimentError(f"the uninterrupted run of the kill drill failed: {last_error_line(done.stderr)}")
    expected = logged_losses(reference)[s.kill_steps]
    failures, lost, notes, inside_a_save = 0, [], [], 0
    for trial in range(s.kills):
        out = work / f"kill-{trial}"
        process = start(train_command(max_steps=s.kill_steps, checkpoint_interval=1, out_dir=str(out)),
                        stdout=DEVNULL, stderr=DEVNULL)
        while saved_step(out) < 2 and process.poll() is None:
            time.sleep(0.02)
        while not (out / STAGING_DIR).exists() and process.poll() is None:  # the next save begins
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.1))  # within the time staging and moving a save of the tiny model takes
        process.send_signal(signal.SIGKILL)
        process.wait()
        inside_a_save += (out / STAGING_DIR).exists()
        trained = max(logged_losses(out), default=0)
        resumed = run_command(train_command(max_steps=s.kill_steps, checkpoint_interval=1, out_dir=str(out),
                                            resume="yes"))
        resumed_at = resumed_step(resumed.stdout)
        got = logged_losses(out).get(s.kill_steps)
        if resumed.returncode or got is None or abs(got - expected) > 1e-6 * abs(expected):
            failures += 1
            notes.append(f"trial {trial}: resume exit {resumed.returncode}, loss {got} vs {expected}: "
                         f"{last_error_line(resumed.stderr)}")
        if resumed_at is not None:
            lost.append(max(0, trained - resumed_at))
    notes.append(f"{inside_a_save} of {s.kills} kills landed while a save was being staged or moved")
    return Drill("kill -9 during saves, then resume", s.kills, failures,
                 f"{steps(sum(lost))} in all (at most {max(lost, default=0)} per kill)", notes=notes)
