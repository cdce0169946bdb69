"""Experiment 5: communication strategies at world sizes 1, 2 and 4, and strong scaling.

    python bench/comm_strategies.py                      # all five modes, 1/2/4 ranks, global batch 8, block 128
    python bench/comm_strategies.py --modes ddp fsdp --world-sizes 1 2 --global-batch 16

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

import argparse
from pathlib import Path

from bench.record import add_results_arg, plt, run_experiment, save_figure
from bench.runner import run_parallel
from bench.timing import environment
from model.config import PRESETS
from runtime.device import choose_device

NAME = "comm_strategies"
MODES = ("gather-scatter", "allreduce", "ddp", "fsdp", "tp")


def add_parallel_args(parser) -> None:
    parser.add_argument("--model", default="tiny", choices=tuple(PRESETS))
    parser.add_argument("--dataset", default="builtin")
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--steps-per-window", type=int, default=4, help="optimizer steps per log window")
    parser.add_argument("--windows", type=int, default=2, help="timed log windows (after one warm-up window)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per rank")
    parser.add_argument("--timeout-s", type=float, default=600, help="per torchrun job")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--work-dir", type=Path, default=Path("out/bench/parallel"))
    add_results_arg(parser)


def train_options(args) -> dict:
    return {"model": args.model, "dataset": args.dataset, "block_size": args.block_size, "device": args.device,
            "warmup_steps": 1}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--world-sizes", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--global-batch", type=int, default=8, help="sequences per step, over all ranks")
    add_parallel_args(parser)
    return parser.parse_args(argv)


def measure(args) -> dict:
    rows = []
    for mode in args.modes:
        for world in args.world_sizes:
            print(f"{mode} on {world} rank(s), global batch {args.global_batch}", flush=True)
            row = run_parallel(args.work_dir, mode, world, args.global_batch, train_options(args), args.windows,
                               args.steps_per_window, args.threads, args.timeout_s)
            rows.append(row)
            if "error" in row:
                print(f"  failed: {row['error']}", flush=True)
            else:
                print(f"  {row['iteration_s']['median'] * 1e3:.0f} ms/iteration, exposed comm "
                      f"{row['exposed_comm_s']['median'] * 1e3:.0f} ms, sent {row['sent_bytes_per_step'] / 2**20:.1f} "
                      f"MiB/step (theory {row['sent_bytes_theory_per_step'] / 2**20:.1f})", flush=True)
    scaling = []
    for mode in args.modes:
        base = next((r for r in rows if r["mode"] == mode and r["world_size"] == 1 and "error" not in r), None)
        for r in rows:
            if r["mode"] == mode and base and "error" not in r:
                scaling.append({"mode": mode, "world_size": r["world_size"],
                                "speedup": base["iteration_s"]["median"] / r["iteration_s"]["median"],
                                "efficiency": base["iteration_s"]["median"] / r["iteration_s"]["median"]
                                / r["world_size"]})
    return {"model": args.model, "block_size": args.block_size, "global_batch": args.global_batch,
            "steps_per_window": args.steps_per_window, "timed_windows": args.windows,
            "threads_per_rank": args.threads, "rows": rows, "strong_scaling": scaling,
            "definitions": {
                "iteration_s": "global batch x block / train.py's tokens/s, per log window; median of the windows",
                "compute_s": "iteration time minus exposed communication",
                "exposed_comm_s": "communication the step waited for (DDP: bucket waits after backward; manual "
                                  "modes: the timed synchronisation; fsdp/tp: all time inside collectives)",
                "sent_bytes_per_step": "bytes rank 0 sends per step, counted at each collective under the ring "
                                       "algorithm; theory: the same count from the parameter and activation shapes",
                "bandwidth_bytes_per_s": "bytes sent / seconds spent inside collectives",
            },
            "environment": environment(choose_device(args.device))}


def plot(result: dict, path) -> str:
    ok = [r for r in result["rows"] if "error" not in r]
    fig, (bars, speed) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"{r['mode']}\n{r['world_size']}" for r in ok]
    compute = [r["compute_s"]["median"] * 1e3 for r in ok]
    comm = [r["exposed_comm_s"]["median"] * 1e3 for r in ok]
    bars.bar(labels, compute, label="compute (and waiting)")
    bars.bar(labels, comm, bottom=compute, label="exposed communication")
    bars.set_ylabel("ms per iteration")
    bars.tick_params(axis="x", labelsize=7)
    bars.legend(fontsize=8)
    for mode in dict.fromkeys(s["mode"] for s in result["strong_scaling"]):
        points = [(s["world_size"], s["speedup"]) for s in result["strong_scaling"] if s["mode"] == mode]
        speed.plot(*zip(*points), marker="o", label=mode)
    worlds = sorted({r["world_size"] for r in ok})
    if worlds:
        speed.plot(worlds, worlds, color="grey", linestyle=":", label="ideal")
    speed.set_xlabel("ranks")
    speed.set_ylabel("speedup over 1 rank (same global batch)")
    speed.legend(fontsize=8)
    for ax in (bars, speed):
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result['model']}, global batch {result['global_batch']} x block {result['block_size']}, "
                 f"{result['threads_per_rank']} thread(s) per rank")
    return save_figure(fig, path)


def main(argv=None) -> dict:
    return run_experiment(NAME, argv, parse_args, measure, plot)


if __name__ == "__main__":
    main()
