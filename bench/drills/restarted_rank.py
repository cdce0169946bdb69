"""Rank killed under --max-restarts: the killed-rank drill's kill under `torchrun --max-restarts=1` with
`--resume auto`, so that torchrun restarts both ranks, which continue from the last checkpoint; a failure is a job
that does not exit 0 or ends with another loss than an uninterrupted run.  Work lost: the steps trained again
after the restart.
"""
from __future__ import annotations

import random
from pathlib import Path

from bench.drills.drill import (Drill, DrillSettings, ddp_job, kill_rank_1, last_error_line, logged_losses,
                                resumed_step, steps)
from bench.experiment import ExperimentError

STEPS = 30
# Restarted ranks that shared torchrun's rendezvous store read the dead ones' addresses (parallel/distributed.py).
ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def run(s: DrillSettings, work: Path) -> Drill:
    rng = random.Random(s.seed + 1)
    reference = work / "restart-reference"
    if not ddp_job(reference, env=ENV, max_steps=STEPS, resume="auto").finish().ok:
        raise ExperimentError("the uninterrupted 2-rank run of the restart drill failed")
    expected = logged_losses(reference)[STEPS]
    failures, lost, notes = 0, [], []
    for trial in range(s.rank_kills):
        out = work / f"restart-{trial}"
        running = ddp_job(out, "--max-restarts=1", env=ENV, max_steps=STEPS, resume="auto")
        trained = kill_rank_1(running, out, rng)
        done = running.finish(timeout_s=300)
        resumed_at = resumed_step(done.stdout)
        got = logged_losses(out).get(STEPS)
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
                 f"{steps(sum(lost))} in all (at most {max(lost, default=0)} per kill)", notes=notes)
