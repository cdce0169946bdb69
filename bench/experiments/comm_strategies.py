"""Communication strategies at world sizes 1, 2 and 4, and strong scaling.

    python -m bench.experiments comm_strategies          # all five modes, 1/2/4 ranks, global batch 8, block 128
    python -m bench.experiments comm_strategies --modes ddp fsdp --world-sizes 1 2 --global-batch 16

Every cell is a `torchrun --standalone --nproc_per_node=N train.py --parallel MODE` job at the same
global batch (data-parallel modes split it over the ranks, `tp` shards the model instead), with
OMP_NUM_THREADS fixed per rank.  From train.py's metrics.jsonl: time per iteration, compute against
exposed communication, bytes each rank sends per step against the count from the shapes alone,
effective bandwidth (bytes sent / seconds inside collectives) and peak memory per rank.  Strong
scaling: speedup = time per iteration on 1 rank / on N ranks, same mode, same global batch.

With gloo on one CPU machine the "network" is loopback and the ranks share the cores: once ranks
outnumber cores, N ranks get no more compute than one, and every collective waits for a rank the
scheduler has parked.  Such figures measure overheads, not what the strategies do on GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.experiment import Experiment
from bench.parallel_runs import ParallelRow, ParallelSettings, run_parallel
from bench.plots import finish, plt
from bench.report_page import Page, MiB, mib, num, spread, timed_as
from runtime.cli import option
from runtime.device import choose_device
from runtime.timing import Environment, environment

MODES = ("gather-scatter", "allreduce", "ddp", "fsdp", "tp")
DEFINITIONS = {
    "iteration_s": "global batch x block / train.py's tokens/s, per log window; median of the windows",
    "compute_s": "iteration time minus exposed communication",
    "exposed_comm_s": "communication the step waited for (DDP: bucket waits after backward; manual modes: the "
                      "timed synchronisation; fsdp/tp: all time inside collectives)",
    "sent_bytes_per_step": "bytes rank 0 sends per step, counted at each collective under the ring algorithm; "
                           "theory: the same count from the parameter and activation shapes",
    "bandwidth_bytes_per_s": "bytes sent / seconds spent inside collectives",
}


@dataclass
class Settings(ParallelSettings):
    modes: list[str] = option(list(MODES), "--parallel modes of train.py", choices=MODES)
    world_sizes: list[int] = option([1, 2, 4], "ranks per job", min=1)
    global_batch: int = option(8, "sequences per step, over all ranks", min=1)


@dataclass
class Scaling:
    mode: str
    world_size: int
    speedup: float  # time per iteration on 1 rank / on world_size ranks
    efficiency: float  # speedup / world_size


@dataclass
class CommStrategies:
    model: str
    block_size: int
    global_batch: int
    steps_per_window: int
    timed_windows: int
    threads_per_rank: int
    rows: list[ParallelRow]
    strong_scaling: list[Scaling]
    definitions: dict[str, str]
    environment: Environment


def measure(settings: Settings, work_dir: Path) -> CommStrategies:
    rows = []
    for mode in settings.modes:
        for world in settings.world_sizes:
            print(f"{mode} on {world} rank(s), global batch {settings.global_batch}", flush=True)
            row = run_parallel(settings, work_dir, mode, world, settings.global_batch)
            rows.append(row)
            if row.error:
                print(f"  failed: {row.error}", flush=True)
            else:
                print(f"  {row.iteration_s.median * 1e3:.0f} ms/iteration, exposed comm "
                      f"{row.exposed_comm_s.median * 1e3:.0f} ms, sent {row.sent_bytes_per_step / MiB:.1f} "
                      f"MiB/step (theory {row.sent_bytes_theory_per_step / MiB:.1f})", flush=True)
    scaling = []
    for mode in settings.modes:
        base = next((r for r in rows if r.mode == mode and r.world_size == 1 and not r.error), None)
        for r in rows:
            if r.mode == mode and base and not r.error:
                speedup = base.iteration_s.median / r.iteration_s.median
                scaling.append(Scaling(mode, r.world_size, speedup, speedup / r.world_size))
    return CommStrategies(settings.model, settings.block_size, settings.global_batch, settings.steps_per_window,
                          settings.windows, settings.threads, rows, scaling, DEFINITIONS,
                          environment(choose_device(settings.device)))


def plot(result: CommStrategies):
    ok = [r for r in result.rows if not r.error]
    fig, (bars, speed) = plt.subplots(1, 2, figsize=(12, max(4.0, 0.3 * len(ok) + 1.2)),
                                      gridspec_kw={"width_ratios": [1.2, 1]})
    # Horizontal bars: a label per row, however many modes and world sizes there are.
    labels = [f"{r.mode}, {r.world_size} rank{'s' if r.world_size > 1 else ''}" for r in ok]
    compute = [r.compute_s.median * 1e3 for r in ok]
    comm = [r.exposed_comm_s.median * 1e3 for r in ok]
    bars.barh(labels, compute, label="compute (and waiting)")
    bars.barh(labels, comm, left=compute, label="exposed communication")
    bars.invert_yaxis()
    bars.set_xlabel("ms per iteration")
    bars.tick_params(axis="y", labelsize=8)
    bars.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1), ncol=2, frameon=False)
    for mode in dict.fromkeys(s.mode for s in result.strong_scaling):
        points = [(s.world_size, s.speedup) for s in result.strong_scaling if s.mode == mode]
        speed.plot(*zip(*points), marker="o", label=mode)
    worlds = sorted({r.world_size for r in ok})
    if worlds:
        speed.plot(worlds, worlds, color="grey", linestyle=":", label="ideal")
    speed.set_xlabel("ranks")
    speed.set_ylabel("speedup over 1 rank (same global batch)")
    speed.legend(fontsize=8)
    return finish(fig, (bars, speed), f"{result.model}, global batch {result.global_batch} x block "
                                      f"{result.block_size}, {result.threads_per_rank} thread(s) per rank")


def section(res: CommStrategies, page: Page) -> None:
    page.add(f"`{res.model}`, global batch {res.global_batch} x block {res.block_size} at every world size, "
             f"torchrun with gloo, {res.threads_per_rank} thread(s) per rank; medians of {res.timed_windows} "
             f"windows of {res.steps_per_window} steps after a warm-up window.\n")
    rows = []
    for x in res.rows:
        if x.error:
            rows.append([x.mode, x.world_size, "failed: " + x.error[:80], "", "", "", "", "", ""])
            continue
        bandwidth = x.bandwidth_bytes_per_s
        rows.append([x.mode, x.world_size, spread(x.iteration_s, 0, 1e3), num(x.compute_s.median * 1e3, 0),
                     num(x.exposed_comm_s.median * 1e3, 0), num(x.sent_bytes_per_step / MiB, 2),
                     num(x.sent_bytes_theory_per_step / MiB, 2),
                     num(bandwidth.median / MiB, 0) if bandwidth else "n/a",
                     " / ".join(mib(m) for m in x.peak_memory_bytes_per_rank)])
    page.add(timed_as("`torchrun ... train.py --parallel MODE`, one job at a time",
                      "not overlapped between jobs (a job's own ranks start together); each job's first log window "
                      "is left out"))
    page.table(["mode", "ranks", "ms/iteration (min-max)", "compute ms", "exposed comm ms", "MiB sent/step",
                "theory MiB", "bandwidth MiB/s", "peak MiB per rank"], rows)
    page.add("Strong scaling (same global batch): speedup = time per iteration on 1 rank / on N ranks.\n")
    worlds = sorted({s.world_size for s in res.strong_scaling})
    modes = list(dict.fromkeys(s.mode for s in res.strong_scaling))
    lookup = {(s.mode, s.world_size): s for s in res.strong_scaling}
    page.table(["mode", *[f"{w} rank(s)" for w in worlds]],
               [[m, *[f"{lookup[(m, w)].speedup:.2f}x" if (m, w) in lookup else "n/a" for w in worlds]]
                for m in modes])
    cores = res.environment.cpu_count
    page.add(f"**Why these scaling figures are poor, and why they are not GPU figures.** This machine has {cores} "
             f"cores and every rank runs {res.threads_per_rank} thread(s): at 2 ranks the job uses the cores one "
             f"rank alone left idle, at 4 ranks four processes share {cores} cores, so the compute cannot speed up "
             f"while every collective waits for whichever rank the scheduler has parked; that waiting is counted as "
             f"communication. Gloo over loopback copies through memory the ranks already compete for. On GPUs each "
             f"rank owns a device and NCCL uses NVLink or InfiniBand, so both the speedups and the bandwidths would "
             f"be of another order. The byte counts, in contrast, are properties of the strategies and hold anywhere: "
             f"measured and theoretical bytes per step are compared in the table.\n")


EXPERIMENT = Experiment(
    name="comm_strategies", title="Communication strategies", about=__doc__, settings=Settings,
    quick=Settings(block_size=64, global_batch=8, steps_per_window=2, windows=2),
    full=Settings(block_size=256, global_batch=16, steps_per_window=5, windows=3),
    result=CommStrategies, measure=measure, plot=plot, section=section)
