"""Rank killed under --max-restarts: the killed-rank drill's kill under `torchrun --max-restarts=1` with
`--resume auto`, so that torchrun restarts both ranks, which continue from the last checkpoint; a failure is a job
that does not exit 0 or ends with another loss than an uninterrupted run.  Work lost: the steps trained again
after the restart.
"""
from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path

from bench.drills.drill import (Drill, DrillSettings, last_error_line, logged_losses, saved_step, steps, train_argv,
                                worker_pids)
from bench.experiment import ExperimentError
from bench.processes import Process, start


def run(s: DrillSettings, work: Path) -> Drill:
    started, rng = time.perf_counter(), random.Random(s.seed + 1)
    steps_in_run = 30

    def job(out: Path, *launcher: str) -> Process:
        return start([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *launcher,
                      *train_argv(parallel="ddp", max_steps=steps_in_run, checkpoint_interval=5, resume="auto",
                                  out_dir=str(out))],
                     threads=1, env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    reference = work / "restart-reference"
    if not job(reference).finish().ok:
        raise ExperimentError("the uninterrupted 2-rank run of the restart drill failed")
    expected = logged_losses(reference)[steps_in_run]
    failures, lost, notes = 0, [], []
    for trial in range(s.rank_kills):
        out = work / f"restart-{trial}"
        running = job(out, "--max-restarts=1")
        while saved_step(out) < 5 and running.poll() is None:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.2, 2.0))  # somewhere in the next checkpoint interval
        trained = max(logged_losses(out), default=0)
        victim = worker_pids(running.pid).get(1)
        if victim is None:
            running.kill_all()
            raise ExperimentError(f"torchrun's rank 1 was not found: {running.finish().stderr[-300:]}")
        os.kill(victim, signal.SIGKILL)
        done = running.finish(timeout_s=300)
        resumed_at = next((int(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("resumed")),
                          None)
        got = logged_losses(out).get(steps_in_run)
        if resumed_at is not None:
            lost.append(max(0, trained - resumed_at))
        if not done.ok or resumed_at is None or got != expected:
            failures += 1
            notes.append(f"trial {trial}: exit {done.returncode}, resumed at {resumed_at}, final loss {got} vs "
                         f"{expected}: {last_error_line(done.stderr)}")
        else:
            notes.append(f"trial {trial}: killed near step {trained}, restarted from step {resumed_at}, final loss "
                         f"equal to the uninterrupted run's")
    return Drill("rank killed under --max-restarts: recovered", s.rank_kills, failures,
                 f"{steps(sum(lost))} in all (at most {max(lost, default=0)} per kill)", time.perf_counter() - started,
                 notes)
