"""Experiment 6: tensor parallelism against FSDP -- throughput and peak memory per rank against batch size.

    python bench/tp_vs_fsdp.py                           # 2 ranks, global batches 2, 4, 8, 16, block 128
    python bench/tp_vs_fsdp.py --world-size 4 --global-batches 4 8 16 32

Both shard the model over the same ranks: FSDP shards parameters, gradients and optimizer state and
splits the batch (each rank a slice of it), tensor parallelism splits every layer's matrices and
runs the whole batch on every rank, all-reducing activations twice per block.  Same train.py runs
as experiment 5 (bench/comm_strategies.py), at several global batches; a batch that runs out of
memory is reported as such.
"""
from __future__ import annotations

import argparse

from bench.comm_strategies import add_parallel_args, train_options
from bench.record import plt, run_experiment, save_figure
from bench.runner import run_parallel
from bench.timing import environment
from runtime.device import choose_device

NAME = "tp_vs_fsdp"
MODES = ("tp", "fsdp")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--global-batches", nargs="+", type=int, default=[2, 4, 8, 16])
    add_parallel_args(parser)
    return parser.parse_args(argv)


def measure(args) -> dict:
    rows = []
    for batch in args.global_batches:
        for mode in MODES:
            print(f"{mode} on {args.world_size} ranks, global batch {batch}", flush=True)
            row = run_parallel(args.work_dir, mode, args.world_size, batch, train_options(args), args.windows,
                               args.steps_per_window, args.threads, args.timeout_s)
            if "error" not in row:
                row["peak_memory_bytes_max_rank"] = max(row["peak_memory_bytes_per_rank"])
                print(f"  {row['tokens_per_s']['median']:,.0f} tokens/s, peak memory "
                      f"{row['peak_memory_bytes_max_rank'] / 2**20:,.0f} MiB per rank", flush=True)
            else:
                print(f"  failed: {row['error']}", flush=True)
            rows.append(row)
    return {"model": args.model, "block_size": args.block_size, "world_size": args.world_size,
            "threads_per_rank": args.threads, "steps_per_window": args.steps_per_window,
            "timed_windows": args.windows, "rows": rows,
            "memory_meaning": "the largest rank's peak: CUDA allocator peak, or on CPU the rank process's peak "
                              "resident set (PyTorch itself included)",
            "environment": environment(choose_device(args.device))}


def plot(result: dict, path) -> str:
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(10, 3.8))
    for mode in MODES:
        ok = [r for r in result["rows"] if r["mode"] == mode and "error" not in r]
        xs = [r["global_batch"] for r in ok]
        speed.plot(xs, [r["tokens_per_s"]["median"] for r in ok], marker="o", label=mode)
        memory.plot(xs, [r["peak_memory_bytes_max_rank"] / 2**20 for r in ok], marker="o", label=mode)
    speed.set_ylabel("tokens / s (all ranks)")
    memory.set_ylabel("peak memory per rank (MiB)")
    for ax in (speed, memory):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("global batch (sequences)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{result['model']}, block {result['block_size']}, {result['world_size']} ranks")
    return save_figure(fig, path)


def main(argv=None) -> dict:
    return run_experiment(NAME, argv, parse_args, measure, plot)


if __name__ == "__main__":
    main()
