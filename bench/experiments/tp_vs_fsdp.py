"""Tensor parallelism against FSDP: throughput and peak memory per rank against batch size.

    python -m bench.experiments tp_vs_fsdp               # 2 ranks, global batches 2, 4, 8, 16, block 128
    python -m bench.experiments tp_vs_fsdp --world-size 4 --global-batches 4 8 16 32

Both shard the model over the same ranks: FSDP shards parameters, gradients and optimizer state and
splits the batch (each rank a slice of it), tensor parallelism splits every layer's matrices and
runs the whole batch on every rank, all-reducing activations twice per block.  The same train.py
jobs as the communication-strategies experiment (bench/parallel_runs.py), at several global
batches; a batch that runs out of memory is reported as such.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.experiment import Experiment
from bench.parallel_runs import ParallelRow, ParallelSettings, run_parallel
from bench.plots import finish, plt
from bench.report_page import Page, mib, num, spread, timed_as
from runtime.cli import option
from runtime.device import choose_device
from runtime.timing import Environment, environment

MODES = ("tp", "fsdp")


@dataclass
class Settings(ParallelSettings):
    world_size: int = option(2, "ranks of both jobs", min=1)
    global_batches: list[int] = option([2, 4, 8, 16], "sequences per step, over all ranks", min=1)


@dataclass
class TpVsFsdp:
    model: str
    block_size: int
    world_size: int
    threads_per_rank: int
    steps_per_window: int
    timed_windows: int
    rows: list[ParallelRow]
    memory_meaning: str
    environment: Environment


def measure(settings: Settings, work_dir: Path) -> TpVsFsdp:
    rows = []
    for batch in settings.global_batches:
        for mode in MODES:
            print(f"{mode} on {settings.world_size} ranks, global batch {batch}", flush=True)
            row = run_parallel(settings, work_dir, mode, settings.world_size, batch)
            if row.error:
                print(f"  failed: {row.error}", flush=True)
            else:
                print(f"  {row.tokens_per_s.median:,.0f} tokens/s, peak memory "
                      f"{row.peak_memory_bytes_max_rank / 2**20:,.0f} MiB per rank", flush=True)
            rows.append(row)
    return TpVsFsdp(settings.model, settings.block_size, settings.world_size, settings.threads,
                    settings.steps_per_window, settings.windows, rows,
                    "the largest rank's peak: CUDA allocator peak, or on CPU the rank process's peak resident set "
                    "(PyTorch itself included)", environment(choose_device(settings.device)))


def plot(result: TpVsFsdp):
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(10, 3.8))
    for mode in MODES:
        ok = [r for r in result.rows if r.mode == mode and not r.error]
        xs = [r.global_batch for r in ok]
        speed.plot(xs, [r.tokens_per_s.median for r in ok], marker="o", label=mode)
        memory.plot(xs, [r.peak_memory_bytes_max_rank / 2**20 for r in ok], marker="o", label=mode)
    speed.set_ylabel("tokens / s (all ranks)")
    memory.set_ylabel("peak memory per rank (MiB)")
    for ax in (speed, memory):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("global batch (sequences)")
    return finish(fig, (speed, memory), f"{result.model}, block {result.block_size}, {result.world_size} ranks",
                  legend=True)


def section(res: TpVsFsdp, page: Page) -> None:
    page.add(f"`{res.model}`, block {res.block_size}, {res.world_size} ranks, {res.threads_per_rank} "
             f"thread(s) per rank. Memory: {res.memory_meaning}.\n")
    rows = []
    for x in res.rows:
        if x.error:
            rows.append([x.global_batch, x.mode, "out of memory" if x.out_of_memory else "failed: " + x.error[:80],
                         "", ""])
        else:
            rows.append([x.global_batch, x.mode, spread(x.tokens_per_s, 0), num(x.exposed_comm_s.median * 1e3, 0),
                         mib(x.peak_memory_bytes_max_rank)])
    page.add(timed_as("`torchrun ... train.py --parallel MODE` (bench/parallel_runs.py), one job at a time",
                      "not overlapped between jobs (a job's own ranks start together); each job's first log window "
                      "is left out"))
    page.table(["global batch", "mode", "tokens/s (min-max)", "exposed comm ms/step", "peak MiB (largest rank)"], rows)


EXPERIMENT = Experiment(
    name="tp_vs_fsdp", title="Tensor parallel against FSDP", about=__doc__, settings=Settings,
    quick=Settings(block_size=64, global_batches=[2, 4, 8, 16], steps_per_window=2, windows=2),
    full=Settings(block_size=256, global_batches=[2, 4, 8, 16, 32], steps_per_window=5, windows=3),
    result=TpVsFsdp, measure=measure, plot=plot, section=section)
