"""Timing helpers shared by the benchmark scripts: warm-up, synchronised repeats, median/min/max."""
from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable

import torch

from runtime.device import synchronize
from runtime.provenance import git_commit


def time_repeats(fn: Callable[[], object], repeats: int, warmup: int = 1, device=torch.device("cpu")) -> list[float]:
    """Seconds per call of `fn`, after `warmup` untimed calls; the device is synchronised around each call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def environment(device: torch.device) -> dict:
    """What the figures were measured on, to be stored beside them."""
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "device_type": device.type,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        # Other processes compete for the cores; a load above the core count means the figures are low.
        "load_average_1m": os.getloadavg()[0],
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                        platform.processor() or platform.machine())
    except OSError:  # not Linux
        return platform.processor() or platform.machine()
