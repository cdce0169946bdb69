"""How every tool times things: synchronised calls, warm-up before repeats, several candidates timed in
turns (so that load from other processes hits them alike), median/min/max, and a record of the machine.

Used by bench/ (the experiments and the scorecard), prune/speed.py and quantize/measure.py.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Hashable, TypeVar

import torch

from runtime.device import synchronize
from runtime.progress import ProgressBar
from runtime.provenance import git_commit

Key = TypeVar("Key", bound=Hashable)
CPU = torch.device("cpu")


@dataclass(frozen=True)
class Spread:
    """The median of repeated measurements, with their range and count."""
    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        if not values:
            raise ValueError("a spread needs at least one measurement")
        return cls(statistics.median(values), min(values), max(values), len(values))


def timed_call(fn: Callable[[], object], device: torch.device = CPU) -> float:
    """Seconds of one call, with the device synchronised before and after (CUDA work is asynchronous)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def time_repeats(fn: Callable[[], object], repeats: int, warmup: int = 1, device: torch.device = CPU) -> list[float]:
    """Seconds per call of `fn`, after `warmup` untimed calls."""
    return time_interleaved({None: fn}, repeats, warmup, device)[None]


def time_interleaved(calls: dict[Key, Callable[[], object]], repeats: int, warmup: int = 1,
                     device: torch.device = CPU, alternate: bool = False,
                     progress: str | None = None) -> dict[Key, list[float]]:
    """Seconds per call of each of `calls`, timed in turns: every round calls each once, so a change in
    machine load hits all of them alike.  The first `warmup` rounds are not timed.  `alternate` reverses
    the order every other round, so that none always runs first (after another's cache traffic);
    `progress` names a progress bar over the rounds."""
    times: dict[Key, list[float]] = {key: [] for key in calls}
    rounds = range(warmup + repeats)
    for round_ in ProgressBar(rounds, desc=progress, leave=False) if progress else rounds:
        order = list(calls)[::-1] if alternate and round_ % 2 else list(calls)
        for key in order:
            elapsed = timed_call(calls[key], device)
            if round_ >= warmup:
                times[key].append(elapsed)
    return times


# The smallest noise floor a speed ratio must clear, however closely two timings of the same model agreed.
MIN_NOISE_FLOOR = 0.05


def noise_floor(*same_model_ratios: float) -> float:
    """How far from 1 chance alone moved the speed ratio of a model against itself (or an identical copy) timed in
    the same run, at least MIN_NOISE_FLOOR: a ratio closer to 1 than this measured nothing."""
    return max(MIN_NOISE_FLOOR, *(abs(ratio - 1) for ratio in same_model_ratios))


def ratio_beside_floor(ratio: float, floor: float) -> str:
    """A speed ratio as a user should read it: `1.45x (noise floor +-6%)`, or, within the floor, `no measurable
    change (+-6% noise floor)` -- never `1.04x` for what two copies of one model also show."""
    if abs(ratio - 1) <= floor:
        return f"no measurable change (+-{floor:.0%} noise floor)"
    return f"{ratio:.2f}x (noise floor +-{floor:.0%})"


def paired_ratio(reference: list[float], candidate: list[float]) -> float:
    """Median over rounds of reference time / candidate time: the speed-up of the candidate, each round
    compared with its own partner (paired samples), which cancels load that changes between rounds."""
    return statistics.median(r / c for r, c in zip(reference, candidate, strict=True))


@dataclass(frozen=True)
class Environment:
    """What figures were measured on, stored beside them."""
    device: str
    device_type: str
    threads: int
    torch: str
    python: str
    git_commit: str
    date: str
    cpu: str
    cpu_count: int | None
    # Other processes compete for the cores; a load above the core count means the figures are low.
    load_average_1m: float


def environment(device: torch.device) -> Environment:
    return Environment(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        device_type=device.type, threads=torch.get_num_threads(), torch=torch.__version__,
        python=platform.python_version(), git_commit=git_commit(),
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), cpu=cpu_model(), cpu_count=os.cpu_count(),
        load_average_1m=os.getloadavg()[0])


def matmul_rate(size: int = 1024, repeats: int = 5) -> list[float]:
    """GFLOP/s of each of `repeats` float32 (size x size) @ (size x size) products with this process's threads:
    what compute-bound work reaches on this host now (another process's load lowers it)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        rates.append(2 * size**3 / (time.perf_counter() - start) / 1e9)
    return rates


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                        platform.processor() or platform.machine())
    except OSError:  # not Linux
        return platform.processor() or platform.machine()
