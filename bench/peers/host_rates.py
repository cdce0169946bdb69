"""What a host could do while a comparison ran: its memory read rate and its float32 matmul rate, the two limits of
a decoding step (reading the weights; multiplying them by a few rows), recorded beside every ratio so that figures
from a slow or a shared host read as such.

    python -m bench.peers.host_rates [--threads N] [--cpus 0 ...]   # prints one JSON line

Measured in a process of its own (`measure_in_process`), started with the threads and cores the runtimes under test
get, so that a pinned, one-core run or a co-running load weighs on these rates as on the runtimes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

from runtime import timing

from bench.processes import run_command

READ_FLOATS = 2**28  # 1 GiB of float32: far more than any cache
MATMUL_SIZE = 2048  # a square float32 product, as issue 50 quotes its hosts' rates


@dataclass
class HostRates:
    read_gb_per_s: float  # median of sums over 1 GiB of float32
    matmul_gflop_per_s: float  # median of 2048 x 2048 float32 products
    threads: int
    cpus: list[int]  # the cores the measuring process could run on


def read_bandwidth(repeats: int = 5) -> list[float]:
    """GB/s of each of `repeats` sums over 1 GiB of float32 with this process's threads: what streaming
    weights can reach."""
    data = torch.ones(READ_FLOATS)  # the values do not change a sum's memory traffic; filling with ones is quick
    data.sum()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        rates.append(data.numel() * 4 / (time.perf_counter() - start) / 1e9)
    return rates


def matmul_rate(repeats: int = 3) -> list[float]:
    """GFLOP/s of each of `repeats` float32 MATMUL_SIZE-square products with this process's threads, after one
    untimed (runtime/timing.py's measure at this size)."""
    return timing.matmul_rate(MATMUL_SIZE, repeats)


def measure() -> HostRates:
    return HostRates(statistics.median(read_bandwidth()), statistics.median(matmul_rate()),
                     torch.get_num_threads(), sorted(os.sched_getaffinity(0)))


def measure_in_process(threads: int, cpus: list[int] | None = None) -> HostRates:
    """HostRates from a fresh process with `threads` torch threads, on `cpus` only when given."""
    command = [sys.executable, "-m", "bench.peers.host_rates", "--threads", str(threads)]
    if cpus:
        command += ["--cpus", *map(str, cpus)]
    finished = run_command(command, timeout_s=300)
    if not finished.ok:
        raise RuntimeError(f"measuring the host's rates failed (exit code {finished.returncode}):\n"
                           f"{finished.output[-2000:]}")
    return HostRates(**json.loads(finished.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--cpus", type=int, nargs="+", help="run on these cores only (as taskset -c)")
    args = parser.parse_args()
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)
    torch.set_num_threads(args.threads)
    print(json.dumps(asdict(measure())))
