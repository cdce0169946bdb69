"""Batch loading time against DataLoader `num_workers`, for the project's loader.

    python -m bench.experiments data_loading             # builtin corpus, block 256, batch 8, workers 0..cpu count

train.py draws batches in-process from data/loader.py's WindowSampler over a memory-mapped token
file.  To ask whether worker processes would help, the sampler is wrapped in a torch IterableDataset
whose worker w takes slice w of each global micro-batch (the sampler's data-parallel slicing, with
workers as ranks), so workers never return the same window.  Measured: the first batch (worker
start-up included) and the steady-state time per batch; the in-process sampler alone is the baseline.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from bench.experiment import Experiment, ExperimentSettings
from bench.plots import finish, plt
from bench.report_page import Page, num, spread, timed_as
from data.loader import WindowSampler
from data.token_files import load_split
from runtime.cli import option
from runtime.timing import Environment, Spread, environment


@dataclass
class Settings(ExperimentSettings):
    dataset: str = option("builtin", "the corpus whose training split is loaded")
    block_size: int = option(256, "tokens per sequence", min=1)
    batch_size: int = option(8, "sequences per batch", min=1)
    batches: int = option(200, "batches timed per setting (after the first)", min=1)
    max_workers: int = option(os.cpu_count() or 1, "largest num_workers tried", min=0)
    repeats: int = option(3, "timed repeats per setting", min=1)


@dataclass
class LoaderRow:
    setting: str
    num_workers: int | None  # None: the in-process sampler, no DataLoader
    first_batch_s: Spread
    per_batch_s: Spread
    tokens_per_s: float


@dataclass
class DataLoading:
    dataset: str
    block_size: int
    batch_size: int
    batches: int
    repeats: int
    train_tokens: int
    rows: list[LoaderRow]
    environment: Environment


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


def measure(settings: Settings, work_dir: Path) -> DataLoading:
    tokens = load_split(settings.dataset, "train")  # tokenized once here, before any worker starts

    def direct():
        sampler = WindowSampler(tokens, settings.block_size, settings.batch_size)
        return iter(sampler.next_batch, None)

    loaders = [("in-process sampler (train.py)", None, direct)]
    for workers in range(settings.max_workers + 1):
        dataset = WindowDataset(settings.dataset, settings.block_size, settings.batch_size)

        def loader(workers=workers, dataset=dataset):
            return iter(DataLoader(dataset, batch_size=None, num_workers=workers,
                                   persistent_workers=False, prefetch_factor=2 if workers else None))

        loaders.append((f"DataLoader num_workers={workers}", workers, loader))

    rows = []
    for label, workers, make in loaders:
        runs = [time_loader(make, settings.batches) for _ in range(settings.repeats)]
        first, per_batch = Spread.of([r[0] for r in runs]), Spread.of([r[1] for r in runs])
        rows.append(LoaderRow(label, workers, first, per_batch,
                              settings.batch_size * settings.block_size / per_batch.median))
        print(f"{label:34} first batch {first.median * 1e3:8.1f} ms, then {per_batch.median * 1e6:8.1f} us/batch")
    return DataLoading(settings.dataset, settings.block_size, settings.batch_size, settings.batches,
                       settings.repeats, len(tokens), rows, environment(torch.device("cpu")))


def plot(result: DataLoading):
    rows = [r for r in result.rows if r.num_workers is not None]
    baseline = next(r for r in result.rows if r.num_workers is None)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    xs = [r.num_workers for r in rows]
    left.plot(xs, [r.per_batch_s.median * 1e3 for r in rows], marker="o", label="DataLoader")
    left.axhline(baseline.per_batch_s.median * 1e3, color="grey", linestyle="--", label="in-process sampler")
    left.set_ylabel("ms per batch (steady state)")
    right.bar([str(x) for x in xs], [r.first_batch_s.median * 1e3 for r in rows], color="tab:orange")
    right.set_ylabel("ms to the first batch")
    for ax in (left, right):
        ax.set_xlabel("num_workers")
    left.legend()
    return finish(fig, (left, right), f"batch {result.batch_size} x block {result.block_size} from {result.dataset}")


def section(res: DataLoading, page: Page) -> None:
    page.add(f"Batches of {res.batch_size} x {res.block_size} tokens from the {res.dataset} training split "
             f"({res.batches} timed batches after the first, {res.repeats} repeats).\n")
    page.add(timed_as("train.py's in-process sampler, and DataLoader worker counts around it, one after another in "
                      "this process",
                      "not overlapped: the first batch (worker start-up included) is reported on its own"))
    page.table(["loader", "first batch ms", "ms per batch", "tokens/s delivered"],
               [[x.setting, spread(x.first_batch_s, 1, 1e3), spread(x.per_batch_s, 3, 1e3), num(x.tokens_per_s, 0)]
                for x in res.rows])
    base = next(r for r in res.rows if r.num_workers is None)
    best = min((r for r in res.rows if r.num_workers is not None), key=lambda x: x.per_batch_s.median)
    page.add(f"The in-process sampler (what train.py uses) needs {base.per_batch_s.median * 1e3:.3f} ms per batch; "
             f"the fastest DataLoader setting is `{best.setting}` at {best.per_batch_s.median * 1e3:.3f} ms. Compare "
             f"with the step times of the phase profile: slicing windows out of a memory-mapped file is "
             f"{'far below' if base.per_batch_s.median < 0.01 else 'not negligible against'} one training step, "
             f"and worker processes add inter-process transfer and start-up.\n")


EXPERIMENT = Experiment(
    name="data_loading", title="Data loading", about=__doc__, settings=Settings,
    quick=Settings(batches=200, repeats=3), full=Settings(batches=1000, repeats=5),
    result=DataLoading, measure=measure, plot=plot, section=section)
