"""Experiment 2: batch loading time against DataLoader `num_workers`, for the project's loader.

    python bench/data_loading.py                         # builtin corpus, block 256, batch 8, workers 0..cpu count

train.py draws batches in-process from data/loader.py's WindowSampler over a memory-mapped token
file.  To ask whether worker processes would help, the sampler is wrapped in a torch IterableDataset
whose worker w takes slice w of each global micro-batch (the sampler's data-parallel slicing, with
workers as ranks), so workers never return the same window.  Measured: the first batch (worker
start-up included) and the steady-state time per batch; the in-process sampler alone is the baseline.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from bench.record import add_results_arg, plt, run_experiment, save_figure
from bench.timing import environment, summary
from data.loader import WindowSampler
from data.shards import load_split

NAME = "data_loading"


class WindowDataset(IterableDataset):
    def __init__(self, dataset: str, block_size: int, batch_size: int, seed: int = 0):
        self.dataset, self.block_size, self.batch_size, self.seed = dataset, block_size, batch_size, seed

    def __iter__(self):
        info = get_worker_info()
        rank, size = (info.id, info.num_workers) if info else (0, 1)
        # Opened in the worker: each process maps the file itself instead of pickling the array.
        sampler = WindowSampler(load_split(self.dataset, "train"), self.block_size, self.batch_size,
                                seed=self.seed, dp_rank=rank, dp_size=size)
        while True:
            yield sampler.next_batch()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--dataset", default="builtin")
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=200, help="batches timed per setting (after the first)")
    parser.add_argument("--max-workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    add_results_arg(parser)
    return parser.parse_args(argv)


def time_loader(make_iterator, batches: int) -> tuple[float, float]:
    """(seconds to the first batch, seconds per batch afterwards)."""
    start = time.perf_counter()
    iterator = make_iterator()
    next(iterator)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return first, (time.perf_counter() - start) / batches


def measure(args) -> dict:
    tokens = load_split(args.dataset, "train")  # tokenized once here, before any worker starts

    def direct():
        sampler = WindowSampler(tokens, args.block_size, args.batch_size)
        return iter(sampler.next_batch, None)

    settings = [("in-process sampler (train.py)", None, direct)]
    for workers in range(args.max_workers + 1):
        dataset = WindowDataset(args.dataset, args.block_size, args.batch_size)

        def loader(workers=workers, dataset=dataset):
            return iter(DataLoader(dataset, batch_size=None, num_workers=workers,
                                   persistent_workers=False, prefetch_factor=2 if workers else None))

        settings.append((f"DataLoader num_workers={workers}", workers, loader))

    rows = []
    for label, workers, make in settings:
        runs = [time_loader(make, args.batches) for _ in range(args.repeats)]
        first = summary([r[0] for r in runs])
        per_batch = summary([r[1] for r in runs])
        rows.append({"setting": label, "num_workers": workers, "first_batch_s": first, "per_batch_s": per_batch,
                     "tokens_per_s": args.batch_size * args.block_size / per_batch["median"]})
        print(f"{label:34} first batch {first['median'] * 1e3:8.1f} ms, then {per_batch['median'] * 1e6:8.1f} "
              f"us/batch")
    return {"dataset": args.dataset, "block_size": args.block_size, "batch_size": args.batch_size,
            "batches": args.batches, "repeats": args.repeats, "train_tokens": len(tokens), "rows": rows,
            "environment": environment(torch.device("cpu"))}


def plot(result: dict, path) -> str:
    rows = [r for r in result["rows"] if r["num_workers"] is not None]
    baseline = next(r for r in result["rows"] if r["num_workers"] is None)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    xs = [r["num_workers"] for r in rows]
    left.plot(xs, [r["per_batch_s"]["median"] * 1e3 for r in rows], marker="o", label="DataLoader")
    left.axhline(baseline["per_batch_s"]["median"] * 1e3, color="grey", linestyle="--", label="in-process sampler")
    left.set_ylabel("ms per batch (steady state)")
    right.bar([str(x) for x in xs], [r["first_batch_s"]["median"] * 1e3 for r in rows], color="tab:orange")
    right.set_ylabel("ms to the first batch")
    for ax in (left, right):
        ax.set_xlabel("num_workers")
        ax.grid(alpha=0.3)
    left.legend()
    fig.suptitle(f"batch {result['batch_size']} x block {result['block_size']} from {result['dataset']}")
    return save_figure(fig, path)


def main(argv=None) -> dict:
    return run_experiment(NAME, argv, parse_args, measure, plot)


if __name__ == "__main__":
    main()
