"""Run `train.py` as the user would (one process, or under torchrun) and read back its metrics.jsonl.

The experiments measure the project's own training path rather than a copy of it: a run here is
`python train.py ...` or `python -m torch.distributed.run --standalone --nproc_per_node=N train.py
--parallel MODE ...`, with a fixed thread count per rank, and the figures come from the records
train.py logs (tokens/s per log window, phase times, communication, peak memory per rank).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.timing import summary
from training.checkpoint import is_training_checkpoint

ROOT = Path(__file__).resolve().parent.parent
TRAIN_SCRIPT = ROOT / "train.py"
# train.py's message when a batch does not fit (it catches torch.OutOfMemoryError).
OOM_MESSAGES = ("does not fit in", "out of memory", "can't allocate memory")


@dataclass
class TrainRun:
    command: list[str]
    returncode: int | None  # None: stopped at the timeout
    elapsed_s: float
    records: list[dict] = field(default_factory=list)
    output_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def out_of_memory(self) -> bool:
        return not self.ok and (any(m in self.output_tail for m in OOM_MESSAGES) or self.returncode == -9)

    def failure(self) -> str:
        if self.timed_out:
            return f"stopped after {self.elapsed_s:.0f}s (time limit)"
        return f"exit code {self.returncode}: {self.output_tail.strip().splitlines()[-1] if self.output_tail.strip() else ''}"

    @property
    def step_records(self) -> list[dict]:
        return [r for r in self.records if "tokens_per_s" in r]

    @property
    def eval_records(self) -> list[dict]:
        return [r for r in self.records if "val_loss" in r]

    def timed_windows(self, skip: int = 1) -> list[dict]:
        """The log windows after the first `skip` (warm-up: allocator, thread pools, first collectives)."""
        return self.step_records[skip:]


def flags(options: dict) -> list[str]:
    """{"batch_size": 4, "compile": True} -> ["--batch-size", "4", "--compile"]; None values are left out."""
    out = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            out += [flag, str(value)]
    return out


def train_command(options: dict, nproc: int | None) -> list[str]:
    if nproc is None:
        return [sys.executable, str(TRAIN_SCRIPT), *flags(options)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            str(TRAIN_SCRIPT), *flags(options)]


def run_command(command: list[str], threads: int | None = None,
                timeout_s: float | None = None) -> tuple[int | None, str, float]:
    """(exit code or None at the timeout, stdout and stderr together, seconds), run from the project root;
    `threads` sets OMP_NUM_THREADS for it and its children."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    # A session of its own, so that a timeout stops torchrun's ranks too, not only torchrun.
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
        returncode = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        returncode = None
    except BaseException:  # Ctrl-C: leave no ranks behind
        os.killpg(process.pid, signal.SIGKILL)
        raise
    return returncode, output, time.perf_counter() - start


def run_train(out_dir: Path, options: dict, nproc: int | None = None, threads: int | None = None,
              timeout_s: float | None = None) -> TrainRun:
    """Train into a fresh `out_dir`; `nproc` launches that many ranks with torchrun (None: one plain process).
    `threads` sets OMP_NUM_THREADS per process."""
    out_dir = Path(out_dir)
    if is_training_checkpoint(out_dir):
        raise ValueError(f"{out_dir} already holds a training run; remove it or choose another folder")
    if (out_dir / "metrics.jsonl").exists():
        (out_dir / "metrics.jsonl").unlink()  # a rerun must not read a failed earlier run's records
    command = train_command({**options, "out_dir": str(out_dir)}, nproc)
    returncode, output, elapsed = run_command(command, threads, timeout_s)
    metrics = out_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] \
        if metrics.exists() else []
    return TrainRun(command, returncode, elapsed, records, output[-3000:])


def window_summary(windows: list[dict], key: str) -> dict | None:
    """Median, min and max of one metric over the timed log windows (None when train.py did not log it)."""
    values = [w[key] for w in windows if w.get(key) is not None]
    return summary(values) if values else None


def run_parallel(work_dir: Path, mode: str, world: int, global_batch: int, options: dict, windows: int,
                 steps_per_window: int, threads: int = 1, timeout_s: float | None = None) -> dict:
    """One torchrun job of train.py at a fixed global batch; per-step figures over the timed windows.

    Data-parallel modes split the global batch over the ranks; `tp` shards the model, so every rank
    sees the whole batch.  The first log window is warm-up and is left out."""
    dp = 1 if mode == "tp" else world
    if global_batch % dp:
        raise ValueError(f"a global batch of {global_batch} does not split over {dp} data-parallel ranks")
    steps = steps_per_window * (windows + 1)
    out_dir = Path(work_dir) / f"{mode}_{world}_b{global_batch}"
    shutil.rmtree(out_dir, ignore_errors=True)  # the benchmark's own scratch run from last time
    run = run_train(out_dir,
                    {**options, "parallel": mode, "tp_size": world if mode == "tp" else 1,
                     "batch_size": global_batch // dp, "max_steps": steps, "log_interval": steps_per_window,
                     "eval_interval": steps, "eval_batches": 1, "final_eval_batches": 1},
                    nproc=world, threads=threads, timeout_s=timeout_s)
    row = {"mode": mode, "world_size": world, "global_batch": global_batch, "per_rank_batch": global_batch // dp,
           "threads_per_rank": threads, "command": " ".join(run.command)}
    if not run.ok:
        return {**row, "error": run.failure(), "out_of_memory": run.out_of_memory}
    timed = run.timed_windows(skip=1)
    tokens_per_step = global_batch * options["block_size"]
    sent = [sum(w["comm_sent_bytes"].values()) for w in timed]
    return {**row,
            "tokens_per_s": window_summary(timed, "tokens_per_s"),
            "iteration_s": summary([tokens_per_step / w["tokens_per_s"] for w in timed]),
            "compute_s": window_summary(timed, "compute_s"),
            "comm_s": window_summary(timed, "comm_s"),
            "exposed_comm_s": window_summary(timed, "exposed_comm_s"),
            "comm_share": window_summary(timed, "comm_share"),
            "sent_bytes_per_step": statistics.median(sent),
            "sent_bytes_by_kind": timed[-1]["comm_sent_bytes"],
            "sent_bytes_theory_per_step": sum(timed[-1]["comm_sent_bytes_theory"].values()),
            "sent_bytes_theory_by_kind": timed[-1]["comm_sent_bytes_theory"],
            "bandwidth_bytes_per_s": window_summary(timed, "bandwidth_bytes_per_s"),
            "peak_memory_bytes_per_rank": timed[-1]["peak_memory_bytes_per_rank"],
            "final_loss": run.step_records[-1]["loss"]}
