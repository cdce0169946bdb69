"""What the parallel experiments (communication strategies, TP against FSDP) share: their common settings
and one torchrun job of train.py at a fixed global batch, read back as a typed row."""
from __future__ import annotations

import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

from bench.experiment import SettingsError, TrainingSettings
from bench.train_runs import run_train, window_summary
from parallel.layout import parallel_dims
from runtime.cli import option
from runtime.timing import Spread
from training.config import TrainConfig


@dataclass
class ParallelSettings(TrainingSettings):
    block_size: int = option(128, "tokens per sequence", min=1)
    steps_per_window: int = option(4, "optimizer steps per log window", min=1)
    windows: int = option(2, "timed log windows (after one warm-up window)", min=1)
    threads: int = option(1, "OMP_NUM_THREADS per rank", min=1)
    timeout_s: float = option(600, "per torchrun job", min=1)


@dataclass
class ParallelRow:
    """One torchrun job; a failed job has `error` and no figures."""
    mode: str
    world_size: int
    global_batch: int
    per_rank_batch: int
    threads_per_rank: int
    command: str
    error: str | None = None
    out_of_memory: bool | None = None
    tokens_per_s: Spread | None = None
    iteration_s: Spread | None = None
    compute_s: Spread | None = None
    comm_s: Spread | None = None
    exposed_comm_s: Spread | None = None
    comm_share: Spread | None = None
    sent_bytes_per_step: float | None = None
    sent_bytes_by_kind: dict[str, float] | None = None
    sent_bytes_theory_per_step: float | None = None
    sent_bytes_theory_by_kind: dict[str, float] | None = None
    bandwidth_bytes_per_s: Spread | None = None  # None when nothing was sent
    peak_memory_bytes_per_rank: list[int] | None = None
    peak_memory_bytes_max_rank: int | None = None
    final_loss: float | None = None


def run_parallel(settings: ParallelSettings, work_dir: Path, mode: str, world: int, global_batch: int) -> ParallelRow:
    """One torchrun job of train.py at a fixed global batch; per-step figures over the timed windows.

    Data-parallel modes split the global batch over the ranks; `tp` shards the model, so every rank
    sees the whole batch.  The first log window is warm-up and is left out."""
    dims = parallel_dims(mode, 1, world)  # train.py's default --tp-size: `tp` spans every rank, the others none
    dp = dims.dp
    if global_batch % dp:
        raise SettingsError(f"a global batch of {global_batch} does not split over {dp} data-parallel ranks")
    steps = settings.steps_per_window * (settings.windows + 1)
    out_dir = Path(work_dir) / f"{mode}_{world}_b{global_batch}"
    shutil.rmtree(out_dir, ignore_errors=True)  # the benchmark's own scratch run from last time
    run = run_train(out_dir,
                    TrainConfig(model=settings.model, dataset=settings.dataset, block_size=settings.block_size,
                                device=settings.device, warmup_steps=1, parallel=mode,
                                tp_size=dims.tp, batch_size=global_batch // dp, max_steps=steps,
                                log_interval=settings.steps_per_window, eval_interval=steps, eval_batches=1,
                                final_eval_batches=1, curves=False),
                    nproc=world, threads=settings.threads, timeout_s=settings.timeout_s)
    row = ParallelRow(mode, world, global_batch, global_batch // dp, settings.threads, " ".join(run.command))
    if not run.ok:
        row.error, row.out_of_memory = run.failure(), run.out_of_memory
        return row
    timed = run.timed_windows(skip=1)
    tokens_per_step = global_batch * settings.block_size
    last = timed[-1]
    row.tokens_per_s = window_summary(timed, "tokens_per_s")
    row.iteration_s = Spread.of([tokens_per_step / w["tokens_per_s"] for w in timed])
    row.compute_s = window_summary(timed, "compute_s")
    row.comm_s = window_summary(timed, "comm_s")
    row.exposed_comm_s = window_summary(timed, "exposed_comm_s")
    row.comm_share = window_summary(timed, "comm_share")
    row.sent_bytes_per_step = statistics.median(sum(w["comm_sent_bytes"].values()) for w in timed)
    row.sent_bytes_by_kind = last["comm_sent_bytes"]
    row.sent_bytes_theory_per_step = sum(last["comm_sent_bytes_theory"].values())
    row.sent_bytes_theory_by_kind = last["comm_sent_bytes_theory"]
    row.bandwidth_bytes_per_s = window_summary(timed, "bandwidth_bytes_per_s")
    row.peak_memory_bytes_per_rank = last["peak_memory_bytes_per_rank"]
    row.peak_memory_bytes_max_rank = max(last["peak_memory_bytes_per_rank"])
    row.final_loss = run.step_records[-1]["loss"]
    return row
