"""The whole suite in seeded random orders (`make test-orders`): shows that no test depends on another having run
first, on the same pytest-xdist worker or before it.

    python -m tests.random_orders                    # seeds 1 2 3; writes bench/results/test_orders.json
    python -m tests.random_orders --seeds 7          # one order

Each run is `make test`'s (`-n 2 --dist loadfile`, each file on one worker, files handed out in collection order)
with pytest-randomly turned on (`-p randomly`, off in pyproject.toml's addopts): it shuffles the files and the tests
within each file by the seed, and tests/conftest.py then leaves its longest-first file order out.  `make test-random
SEED=n` runs one such order without recording it.  Each run's seed, counts, wall time and the first files it handed
out are recorded, with the host's memory read rate and matmul rate beside them (a busy host stretches every figure).
"""
from __future__ import annotations

import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.processes import ROOT, run_command
from bench.record import RESULTS_DIR, write_result
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.errors import UserError
from runtime.timing import Environment, environment

COUNTED = ("passed", "failed", "errors", "skipped", "xfailed", "xpassed")
FIRST_FILES = 6  # files named per run, to show that the orders differ


@dataclass
class OrdersConfig:
    seeds: list[int] = option([1, 2, 3], "pytest-randomly seeds, one run each", min=0)
    workers: int = option(2, "pytest-xdist workers (make test's: one per core)", min=1)
    results_dir: Path = option(RESULTS_DIR, "where test_orders.json goes")

    def __post_init__(self):
        check_options(self, UserError)


@dataclass
class OrderRun:
    seed: int
    exit_code: int
    wall_s: float
    counts: dict[str, int]  # passed, failed, errors, skipped, ... as pytest's closing line says
    summary: str  # that closing line
    first_files: list[str]  # the files in the order this seed gave them (collection order, as handed to workers)
    failures: list[str] = field(default_factory=list)  # pytest's FAILED and ERROR lines
    state_put_back: str = ""  # tests/conftest.py's line naming tests that left process-wide state behind


@dataclass
class HostRates:
    """What the host could do while the runs ran: a busy or slow host stretches every wall time."""
    memory_read_gb_per_s: float  # median of sums over 1 GiB of float32
    matmul_gflop_per_s: float  # median of 1024 x 1024 float32 products


@dataclass
class OrdersReport:
    command: str
    runs: list[OrderRun]
    all_passed: bool
    host: HostRates
    environment: Environment | None = None


def pytest_command(seed: int, workers: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder",
            "-p", "randomly", "-p", "no:cacheprovider", "--randomly-seed", str(seed), *extra]


def file_order(seed: int) -> list[str]:
    """The test files in the order the seed gives them (a collection only: quick)."""
    listed = run_command(pytest_command(seed, 1, "--collect-only", "-n", "0"), cwd=ROOT)  # -q (addopts): node ids
    files = [line.split("::")[0] for line in listed.stdout.splitlines() if "::" in line]
    return list(dict.fromkeys(files))


def counts(summary: str) -> dict[str, int]:
    """pytest's closing line, e.g. `590 passed, 14 skipped, 2 warnings in 301.2s`, as numbers."""
    found = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}
    found["errors"] = found.pop("error", 0) + found.get("errors", 0)
    return {word: found.get(word, 0) for word in COUNTED}


def run_order(seed: int, workers: int) -> OrderRun:
    first = file_order(seed)[:FIRST_FILES]
    started = time.perf_counter()
    run = run_command(pytest_command(seed, workers), cwd=ROOT)
    wall = time.perf_counter() - started
    lines = run.stdout.strip().splitlines()
    summary = next((line.strip("= ") for line in reversed(lines) if re.search(r"\d+ (passed|failed)", line)), "")
    if not summary:  # pytest itself broke (a usage or collection error)
        raise UserError(f"pytest exited {run.returncode} without a closing line: {lines[-1:] or run.stderr[-300:]}")
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    put_back = next((line for line in lines if line.startswith("process-wide state put back")), "")
    print(f"seed {seed}: {summary} (exit {run.returncode}, {wall:.0f} s wall)", flush=True)
    return OrderRun(seed, run.returncode, round(wall, 1), counts(summary), summary, first, failures, put_back)


def host_rates(repeats: int = 5) -> HostRates:
    data = torch.ones(2**28)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    data.sum(), a @ b  # warm
    reads, products = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        reads.append(data.numel() * 4 / (time.perf_counter() - start) / 1e9)
        start = time.perf_counter()
        a @ b
        products.append(2 * 1024**3 / (time.perf_counter() - start) / 1e9)
    return HostRates(round(statistics.median(reads), 2), round(statistics.median(products), 1))


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(OrdersConfig, __doc__, argv)
    host = host_rates()
    command = " ".join(["python -m pytest", *pytest_command(0, cfg.workers)[3:-1], "SEED"])
    runs: list[OrderRun] = []
    for seed in cfg.seeds:  # written after each order: a run stopped part-way keeps the orders it finished
        runs.append(run_order(seed, cfg.workers))
        report = OrdersReport(command, runs, all(r.exit_code == 0 for r in runs), host,
                              environment(torch.device("cpu")))
        write_result(cfg.results_dir, "test_orders", report)
    if not report.all_passed:
        sys.exit(f"error: {sum(r.exit_code != 0 for r in runs)} of {len(runs)} orders failed: "
                 + "; ".join(f"seed {r.seed}: {r.summary}" for r in runs if r.exit_code != 0))


if __name__ == "__main__":
    main()
