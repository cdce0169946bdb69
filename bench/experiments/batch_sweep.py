"""Training speed against micro-batch size, up to the first out-of-memory error.

    python -m bench.experiments batch_sweep                  # tiny preset, block 256, batches 1, 2, 4, ... 256
    python -m bench.experiments batch_sweep --model gpt2 --max-batch 64 --memory-limit-gib 0   # on a GPU: no cap

For each micro-batch size (doubling): tokens per second of train.py's single-device step (median of
timed repeats after a warm-up) and the time one epoch-equivalent of the training split would take at
that speed.  The first size that runs out of memory ends the sweep and is reported as the limit.

On CPU a real out-of-memory ends in the kernel's OOM killer, not an exception; so by default the
sweep caps this process's address space (RLIMIT_AS) at --memory-limit-gib above its size at the
start, which turns exhaustion into an allocation failure that can be caught.  On CUDA the device's
own memory is the limit.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiment import Experiment, SettingsError, TrainingSettings
from bench.plots import finish, plt
from bench.report_page import Page, mib, num, spread, timed_as
from data.loader import WindowSampler
from data.token_files import load_split
from model.config import preset
from model.gpt import GPT
from runtime.cli import option
from runtime.device import choose_device, is_out_of_memory, peak_memory_bytes, precision_policy, release_memory
from runtime.timing import Environment, Spread, environment, time_repeats
from training.step import TrainStep


@dataclass
class Settings(TrainingSettings):
    block_size: int | None = option(None, "tokens per sequence (default: the model's "
                                          "context)", min=1)
    max_batch: int = option(256, "largest micro-batch tried (doubling from 1)", min=1)
    steps: int = option(2, "optimizer steps per timed repeat", min=1)
    repeats: int = option(2, "timed repeats per batch size", min=1)
    memory_limit_gib: float = option(6.0, "CPU only: address-space cap above the "
                                          "starting size (0: no cap)", min=0)


@dataclass
class BatchRow:
    batch_size: int
    tokens_per_s: Spread
    step_s: Spread
    epoch_equivalent_s: float
    peak_memory_bytes: int


@dataclass
class Limit:
    batch_size: int | None  # None: no size ran out of memory
    reason: str


@dataclass
class BatchSweep:
    model: str
    block_size: int
    dataset: str
    train_tokens: int
    steps_per_repeat: int
    repeats: int
    rows: list[BatchRow]
    limit: Limit
    memory_cap: str | None
    peak_memory_meaning: str
    environment: Environment


def address_space_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))


@contextlib.contextmanager
def memory_cap(device: torch.device, limit_gib: float):
    """Yield a description of the cap in force (None when there is none)."""
    if device.type != "cpu" or not limit_gib:
        yield None
        return
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = address_space_bytes() + int(limit_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        yield f"address space capped at {limit_gib:g} GiB above the process's starting size (RLIMIT_AS)"
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def batch_sizes(max_batch: int) -> list[int]:
    sizes, b = [], 1
    while b <= max_batch:
        sizes.append(b)
        b *= 2
    return sizes


def measure(settings: Settings, work_dir: Path) -> BatchSweep:
    device = choose_device(settings.device)
    precision = precision_policy(device)
    config = preset(settings.model)
    block = settings.block_size or config.block_size
    if block > config.block_size:
        raise SettingsError(f"--block-size {block} exceeds the {settings.model} context of {config.block_size}")
    torch.manual_seed(0)
    model = GPT(config).to(device)
    step = TrainStep.single_device(model, device, precision)
    train_tokens = load_split(settings.dataset, "train")
    rows, limit = [], None
    with memory_cap(device, settings.memory_limit_gib) as cap:
        for batch in batch_sizes(settings.max_batch):
            try:
                sampler = WindowSampler(train_tokens, block, batch)
            except ValueError as e:
                limit = Limit(batch, f"data: {e}")
                break
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            try:
                times = time_repeats(lambda: [step(sampler.next_batch) for _ in range(settings.steps)],
                                     settings.repeats, warmup=1, device=device)
            except Exception as e:
                if not is_out_of_memory(e):
                    raise
                del e  # its traceback holds the failed step's tensors
                release_memory(device)
                limit = Limit(batch, "out of memory")
                print(f"batch {batch}: out of memory -- the limit", file=sys.stderr)
                break
            tokens = settings.steps * batch * block
            tps = Spread.of([tokens / t for t in times])
            rows.append(BatchRow(batch, tps, Spread.of([t / settings.steps for t in times]),
                                 len(train_tokens) / tps.median, peak_memory_bytes(device)))
            print(f"batch {batch:>4}: {tps.median:9,.0f} tokens/s, epoch-equivalent "
                  f"{rows[-1].epoch_equivalent_s:8.1f} s", file=sys.stderr)
    return BatchSweep(settings.model, block, settings.dataset, len(train_tokens), settings.steps, settings.repeats,
                      rows, limit or Limit(None, f"no out-of-memory up to --max-batch {settings.max_batch}"), cap,
                      "CUDA: allocator peak at that batch size; CPU: the process's peak resident set so far (it "
                      "never decreases, so only growth is informative)", environment(device))


def plot(result: BatchSweep):
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    xs = [r.batch_size for r in result.rows]
    left.plot(xs, [r.tokens_per_s.median for r in result.rows], marker="o")
    left.set_ylabel("tokens / s")
    right.plot(xs, [r.epoch_equivalent_s for r in result.rows], marker="o", color="tab:orange")
    right.set_ylabel("seconds per epoch-equivalent")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("micro-batch size")
        if result.limit.batch_size:
            ax.axvline(result.limit.batch_size, color="red", linestyle="--", label=result.limit.reason)
    return finish(fig, (left, right), f"{result.model}, block {result.block_size}",
                  legend=bool(result.limit.batch_size))


def section(res: BatchSweep, page: Page) -> None:
    page.add(f"Model `{res.model}`, block {res.block_size}; an epoch-equivalent is the {res.train_tokens:,} "
             f"tokens of the {res.dataset} training split at the measured speed.\n")
    page.add(timed_as("`TrainStep`, train.py's single-device step, in this one process, one micro-batch size after "
                      "another",
                      "not overlapped: an untimed warm-up step at each size, in this process"))
    page.table(["micro-batch", "tokens/s (min-max)", "s/step", "s per epoch-equivalent", "peak memory MiB"],
               [[x.batch_size, spread(x.tokens_per_s, 0), num(x.step_s.median, 3), num(x.epoch_equivalent_s, 0),
                 mib(x.peak_memory_bytes)] for x in res.rows])
    limit = res.limit
    page.add(f"**Limit:** {f'batch {limit.batch_size}: ' if limit.batch_size else ''}{limit.reason}."
             + (f" Memory cap: {res.memory_cap}." if res.memory_cap else "")
             + f" Peak memory: {res.peak_memory_meaning}.\n")
    if res.rows:
        best = max(res.rows, key=lambda x: x.tokens_per_s.median)
        first = res.rows[0]
        page.add(f"Fastest: micro-batch {best.batch_size} at {best.tokens_per_s.median:,.0f} tokens/s "
                 f"({best.tokens_per_s.median / first.tokens_per_s.median:.1f}x batch {first.batch_size}).\n")


EXPERIMENT = Experiment(
    name="batch_sweep", title="Batch-size sweep", about=__doc__, settings=Settings,
    quick=Settings(block_size=128, max_batch=128, steps=1, repeats=2),
    full=Settings(max_batch=256, steps=3, repeats=3),
    result=BatchSweep, measure=measure, plot=plot, section=section)
