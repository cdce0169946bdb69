"""What a fault drill is, and what the drills share.  A drill (one module each in bench/drills/) runs the real
tools in their own processes under one suite's settings and returns a `Drill`: its trials, failures, the work lost
and notes (the faults experiment times it).  Shared: the drills' training run, alone or as a 2-rank DDP job whose
rank 1 is killed, reading what a run logged and saved, and the small served model.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.experiment import ExperimentError, ExperimentSettings, SettingsError
from bench import train_runs
from bench.processes import Process, start
from model.config import GPTConfig
from model.gpt import GPT
from runtime.cli import option
from runtime.provenance import provenance
from storage.artifact import save_artifact
from storage.training_state import TrainingState
from storage.weights import ArtifactError
from training.config import TrainConfig

# The drills' training run; each drill changes its steps, checkpoints and folder.
DRILL_RUN = TrainConfig(model="tiny", dataset="builtin", device="cpu", batch_size=4, block_size=64, log_interval=1,
                        eval_interval=1000, final_eval_batches=2, warmup_steps=5, lr=2e-3)


def train_command(**changes) -> list[str]:
    """train.py's command line for the drills' run with `changes` (typed: a misspelt setting fails here)."""
    return train_runs.train_command(dataclasses.replace(DRILL_RUN, **changes))


def ddp_job(out: Path, *launcher: str, env: dict[str, str] | None = None, **changes) -> Process:
    """The drills' run as a 2-rank DDP job under torchrun (`launcher`: torchrun's own flags), a checkpoint every 5
    steps, into `out`."""
    config = dataclasses.replace(DRILL_RUN, parallel="ddp", checkpoint_interval=5, out_dir=str(out), **changes)
    return start(train_runs.train_command(config, 2, *launcher), threads=1, env=env)


def kill_rank_1(job: Process, out: Path, rng: random.Random) -> int:
    """SIGKILL to the job's rank 1 at a random moment of the checkpoint interval after its first checkpoint; the
    last step it had logged then."""
    while saved_step(out) < 5 and job.poll() is None:
        time.sleep(0.05)
    time.sleep(rng.uniform(0.2, 2.0))
    trained = max(logged_losses(out), default=0)
    victim = worker_pids(job.pid).get(1)
    if victim is None:
        job.kill_all()
        raise ExperimentError(f"torchrun's rank 1 was not found: {job.finish().stderr[-300:]}")
    os.kill(victim, signal.SIGKILL)
    return trained


@dataclass
class DrillSettings(ExperimentSettings):
    reader_steps: int = option(12, "steps of the run read during saves (one save a step)", min=1)
    readers: int = option(2, "reader processes beside that run", min=1)
    kills: int = option(3, "kill -9 drills", min=1)
    kill_steps: int = option(12, "steps of each killed-and-resumed run", min=8)
    poison_batches: int = option(3, "batches with a poison request", min=1)
    greedy_per_batch: int = option(3, "greedy requests batched with each poison one", min=1)
    slow_clients: int = option(20, "connections trickling their headers", min=1)
    read_timeout_s: float = option(2.0, "the server's --read-timeout-s in that drill")
    rank_kills: int = option(1, "2-rank DDP jobs whose second rank is killed (each drill: "
                                "job ends, job restarts)", min=1)
    dist_timeout_s: float = option(20.0, "those jobs' --dist-timeout-s")
    disk_full_runs: int = option(1, "training runs that fill a small tmpfs")
    grace_modes: list[str] = option([], "layouts of the GPT-2 Medium stop-beyond-the-grace drill (tp, fsdp; about 12 "
                                        "min each on 2 CPU cores; none in the quick run)", may_be_empty=True)
    grace_s: int = option(30, "torchrun's --shutdown-timeout in that drill: the grace before its SIGKILL", min=0)
    seed: int = option(0, "seed of the kill moments")

    def __post_init__(self):
        super().__post_init__()
        for mode in self.grace_modes:
            if mode not in ("tp", "fsdp"):
                raise SettingsError(f"--grace-modes takes tp and fsdp, got {mode!r}")


@dataclass
class Drill:
    name: str
    trials: int
    failures: int
    work_lost: str  # in the drill's own unit, or "-" where nothing can be lost
    seconds: float = 0.0  # the whole drill's, set by the faults experiment that runs it
    notes: list[str] = field(default_factory=list)


def last_error_line(text: str) -> str:
    """The line that says what went wrong: the tool's own `error:` line, else torchrun's exit summary."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for marker in ("error:", "exitcode", "Signal") for line in reversed(lines) if marker in line),
                lines[-1] if lines else "")[:200]


def steps(n: int) -> str:
    return f"{n} step{'' if n == 1 else 's'}"


def resumed_step(stdout: str) -> int | None:
    """The step train.py said it resumed from (its `resumed ... step N` line), or None."""
    return next((int(line.split()[-1]) for line in stdout.splitlines()
                 if line.startswith("resumed") and line.split()[-1].isdigit()), None)


def logged_losses(folder: Path) -> dict[int, float]:
    path = folder / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def saved_step(folder: Path) -> int:
    try:
        state = TrainingState.read(folder)
        return state.step if state else 0
    except ArtifactError:  # read while the first save was being written
        return 0


def small_artifact(folder: Path) -> Path:
    """The served model of the server drills, saved by the first drill that needs it."""
    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=128))
        save_artifact(folder, model, model.config, "float", provenance("bench/drills/drill.py"))
    return folder


def worker_pids(parent: int) -> dict[int, int]:
    """LOCAL_RANK -> pid of torchrun's worker processes (read from /proc)."""
    workers = {}
    for task in Path(f"/proc/{parent}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            rank = next((int(v.split(b"=")[1]) for v in env if v.startswith(b"LOCAL_RANK=")), None)
            if rank is not None:
                workers[rank] = int(child)
    return workers
