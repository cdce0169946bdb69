"""The server's CPU per streamed token, by thread: the event loop's and the engine's, beside generate() alone.

    python -m bench.standalone.serve_cpu_split                     # this checkout; GPT-2 124M, random weights
    python -m bench.standalone.serve_cpu_split --baseline main     # and main's code, in interleaved rounds

Each round runs every side in a fresh process (bench/standalone/serve_cpu_side.py, with that side's code first on
PYTHONPATH): generate() alone at each --clients batch size, then the server in that process, uvicorn in the main
thread, streaming /v1/completions to 1 client and to each --clients level from a process of their own.  The event
loop's and the engine thread's CPU (their own time on a core) are divided by the tokens served.  The engine's
includes its share of each step's products (torch runs the calling thread as one of its intra-op workers), so
generate()'s calling thread at the same batch size is measured too, and the CPU each thread spends inside the
model's passes (DecodeSteps.logits) is counted apart: the engine's CPU outside its passes is its bookkeeping, read
directly (the engine's CPU beyond generate()'s is the same less generate()'s own, but carries the difference
between the server's batches, whose rows join and leave, and generate()'s full ones).
The host's memory read and matmul rates are measured before the rounds, and the 1-minute load average after each
side, since a busy host inflates every figure.  Results: bench/results/serve_cpu_split/serve_cpu_split.json.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiments.generate_speed import checkout
from bench.experiments.serve_speed import random_artifact
from bench.peers.host_rates import HostRates, measure_in_process
from bench.processes import ROOT, run_command
from bench.record import RESULTS_DIR, write_result
from data.tokenizer import ranks_file
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.errors import UserError
from runtime.timing import Environment, Spread, environment

SIDE_SCRIPT = Path(__file__).resolve().parent / "serve_cpu_side.py"
SIDE_TIMEOUT_S = 1800.0


@dataclass
class ServeCpuSplitConfig:
    model: str = option("gpt2", "the preset served, with random weights (seed 0)")
    weights: str = option("fp32", "the artifact served: fp32, or int8 as `quantize/dynamic.py --head int8`",
                          choices=("fp32", "int8"))
    new_tokens: int = option(64, "tokens per request (exactly: ignore_eos)", min=1)
    clients: list[int] = option([1, 4], "clients streaming at once, one level each; generate() alone runs at each "
                                        "as its batch size", min=1)
    requests: int = option(4, "requests each client sends in turn per level", min=1)
    rounds: int = option(3, "interleaved rounds (every side once per round)", min=1)
    decode: str = option("traced", "how decode steps run, in generate() and in the server", choices=("traced",
                                                                                                    "dynamic"))
    baseline: str | None = option(None, "a git revision whose code is measured too, in the same rounds")
    results_dir: Path = option(RESULTS_DIR / "serve_cpu_split", "where serve_cpu_split.json goes")

    def __post_init__(self):
        check_options(self, UserError)


@dataclass
class LevelCpu:
    clients: int
    client_ms: Spread  # the clients' process's CPU per token streamed (the load test's client), over rounds
    event_loop_ms: Spread  # the event loop thread's CPU per token served
    engine_ms: Spread  # the engine thread's
    engine_bookkeeping_ms: Spread  # the engine thread's outside the model's passes
    generate_ms: Spread  # generate()'s calling thread at batch = clients
    generate_bookkeeping_ms: Spread  # generate()'s calling thread outside the model's passes
    engine_beyond_generate_ms: Spread  # engine less generate(), per round


@dataclass
class SideCpu:
    code: str  # "this checkout" or the baseline revision
    levels: list[LevelCpu]
    load_average_1m: list[float]  # after each round's run of this side


@dataclass
class ServeCpuSplit:
    command: str
    model: str
    weights: str
    new_tokens: int
    requests_per_client: int
    decode: str
    sides: list[SideCpu]
    host_rates: HostRates  # measured before the rounds, with this process's threads
    environment: Environment


def run_side(root: Path, settings: dict) -> dict:
    """One side's measurement in a fresh process with `root`'s code."""
    finished = run_command([sys.executable, str(SIDE_SCRIPT), "measure", json.dumps(settings)], cwd=root,
                           env={"PYTHONPATH": str(root), "GPT2_TIKTOKEN_FILE": str(ranks_file())},
                           timeout_s=SIDE_TIMEOUT_S)
    if not finished.ok:
        raise UserError(f"measuring {root} failed (exit code {finished.returncode}):\n{finished.output[-3000:]}")
    return json.loads(finished.stdout.strip().splitlines()[-1])


def side_result(code: str, runs: list[dict], clients: list[int]) -> SideCpu:
    levels = []
    for i, level in enumerate(clients):
        client = [run["levels"][i]["client_ms"] for run in runs]
        loop = [run["levels"][i]["event_loop_ms"] for run in runs]
        engine = [run["levels"][i]["engine_ms"] for run in runs]
        engine_outside = [run["levels"][i]["engine_ms"] - run["levels"][i]["engine_passes_ms"] for run in runs]
        alone = [run["generate_ms"][str(level)] for run in runs]
        alone_outside = [run["generate_ms"][str(level)] - run["generate_passes_ms"][str(level)] for run in runs]
        levels.append(LevelCpu(level, Spread.of(client), Spread.of(loop), Spread.of(engine), Spread.of(engine_outside),
                               Spread.of(alone), Spread.of(alone_outside),
                               Spread.of([e - g for e, g in zip(engine, alone)])))
    return SideCpu(code, levels, [run["load_average_1m"] for run in runs])


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(ServeCpuSplitConfig, __doc__, argv)
    if ranks_file() is None:
        raise UserError("the GPT-2 tokenizer file is missing; run `python -m data.fetch_tokenizer` (or `make setup`)")
    rates = measure_in_process(torch.get_num_threads())
    print(f"host: read {rates.read_gb_per_s:.1f} GB/s, matmul {rates.matmul_gflop_per_s:.0f} GFLOP/s, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="serve_cpu_split-") as tmp:
        work = Path(tmp)
        artifact = random_artifact(cfg.model, work, cfg.weights)
        sides = {"this checkout": ROOT}
        if cfg.baseline is not None:
            sides[cfg.baseline] = checkout(cfg.baseline, work / "baseline")
        settings = {"artifact": str(artifact), "new_tokens": cfg.new_tokens, "clients": cfg.clients,
                    "requests": cfg.requests, "decode": cfg.decode}
        runs: dict[str, list[dict]] = {code: [] for code in sides}
        for round_ in range(cfg.rounds):
            for code, root in sides.items():
                runs[code].append(run_side(root, settings))
                run = runs[code][-1]
                for clients, level in zip(cfg.clients, run["levels"]):
                    print(f"round {round_ + 1}, {code}, {clients} client(s), CPU ms/token: clients "
                          f"{level['client_ms']:.3f}, event loop {level['event_loop_ms']:.3f}, engine "
                          f"{level['engine_ms']:.2f} (outside passes "
                          f"{level['engine_ms'] - level['engine_passes_ms']:.3f}), generate() "
                          f"{run['generate_ms'][str(clients)]:.2f} (outside passes "
                          f"{run['generate_ms'][str(clients)] - run['generate_passes_ms'][str(clients)]:.3f}); "
                          f"load {run['load_average_1m']:.1f}", flush=True)
    result = ServeCpuSplit(" ".join(["python -m bench.standalone.serve_cpu_split", *(argv or sys.argv[1:])]),
                           cfg.model, cfg.weights, cfg.new_tokens, cfg.requests, cfg.decode,
                           [side_result(code, runs[code], cfg.clients) for code in sides], rates,
                           environment(torch.device("cpu")))
    write_result(cfg.results_dir, "serve_cpu_split", result)


if __name__ == "__main__":
    main()
