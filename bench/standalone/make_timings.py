"""Time a new user's two commands in the README's order, `make demo` then `make test`, on a fresh clone of the
current commit.

    python bench/standalone/make_timings.py   # about 11 minutes on 2 CPU cores; writes
                                              # bench/results/make_timings.json

The clone starts without `.venv`, so `make demo` includes creating it and installing the pins (from the local
wheel cache where there is one) and fetching the tokenizer; `make test` then runs with that `.venv`, as for a
user who ran the README's commands in order (`--targets test,demo` times the other order, CI's: `make test`
from nothing).  The README quotes these figures.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.processes import INHERIT, ROOT, run_command
from bench.record import RESULTS_DIR, write_result
from runtime.cli import entry_point, option, parse_config
from runtime.errors import UserError
from runtime.provenance import git_commit
from runtime.timing import Environment, environment


@dataclass
class TimingsConfig:
    targets: str = option("demo,test", "make targets (comma-separated), timed one after the other in one clone")
    results_dir: Path = option(RESULTS_DIR, "where make_timings.json goes")


@dataclass
class TargetTiming:
    target: str
    wall_s: float
    exit_code: int
    last_line: str  # pytest's summary, or the demo's last line


@dataclass
class MakeTimings:
    commit: str
    timings: list[TargetTiming]
    environment: Environment


def time_targets(cfg: TimingsConfig) -> MakeTimings:
    commit = git_commit()
    timings = []
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "clone"
        if not run_command(["git", "clone", "-q", str(ROOT), str(clone)], stdout=INHERIT, stderr=INHERIT).ok:
            raise UserError(f"git could not clone {ROOT} into {clone}")
        for target in cfg.targets.split(","):
            # The clone's make runs the clone's code: this process's environment, not this checkout first on
            # PYTHONPATH.
            run = run_command(["make", target], cwd=clone, base_env=os.environ)
            lines = [line for line in run.output.splitlines() if line.strip()]
            summary = next((line for line in reversed(lines) if " passed" in line), lines[-1] if lines else "")
            timings.append(TargetTiming(target, run.seconds, run.returncode, summary.strip()[:200]))
            minutes, rest = divmod(round(run.seconds), 60)  # whole minutes: 333 s is 5 min 33 s, not "6 min 33 s"
            print(f"make {target}: {minutes} min {rest:02d} s, exit {run.returncode}: {summary}")
            if run.returncode:
                # pytest's FAILED/ERROR lines name what broke; stderr (pip's notices) would bury them.
                failures = [line for line in run.stdout.splitlines() if line.startswith(("FAILED", "ERROR", "E "))]
                raise UserError(f"make {target} failed on a fresh clone of {commit}:\n"
                                + "\n".join(failures[-30:] or lines[-20:]))
    return MakeTimings(commit, timings, environment(torch.device("cpu")))


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(TimingsConfig, __doc__, argv)
    write_result(cfg.results_dir, "make_timings", time_targets(cfg))


if __name__ == "__main__":
    main()
