"""Killed rank: one rank of a 2-rank DDP job (a checkpoint every 5 steps) is killed with SIGKILL at a random moment
after its first checkpoint; a failure is a job that does not end within the collective timeout plus 60 s with an
error.  Work lost: steps after the last checkpoint.
"""
from __future__ import annotations

import random
import time
from pathlib import Path

from bench.drills.drill import (Drill, DrillSettings, ddp_job, kill_rank_1, last_error_line, logged_losses, saved_step,
                                steps)
from bench.experiment import ExperimentError


def run(s: DrillSettings, work: Path) -> Drill:
    if not Path("/proc/self/task").exists():
        raise ExperimentError("the killed-rank drill finds torchrun's workers through /proc (Linux)")
    rng = random.Random(s.seed)
    failures, lost, notes = 0, [], []
    for trial in range(s.rank_kills):
        out = work / f"rank-{trial}"
        job = ddp_job(out, max_steps=500, dist_timeout_s=s.dist_timeout_s)
        kill_rank_1(job, out, rng)
        killed_at = time.monotonic()
        done = job.finish(timeout_s=s.dist_timeout_s + 60)
        ended_s = None if done.returncode is None else time.monotonic() - killed_at
        trained = max(logged_losses(out), default=0)
        lost.append(max(0, trained - saved_step(out)))
        if ended_s is None or done.ok:
            failures += 1
            notes.append(f"trial {trial}: the job {'did not end' if ended_s is None else 'exited 0'}")
        else:
            notes.append(f"trial {trial}: ended {ended_s:.1f} s after the kill, exit {done.returncode}: "
                         f"{last_error_line(done.stderr)}")
    return Drill("one rank of 2 killed (DDP, gloo)", s.rank_kills, failures, f"{steps(sum(lost))} in all", notes=notes)
