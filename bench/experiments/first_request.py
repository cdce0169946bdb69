"""The first requests after start-up against the tenth (issue 49): does a fresh server answer its first request as
fast as a warm one?

    python -m bench.experiments first_request               # GPT-2 124M config, random weights, 1 and 4 clients

For each start-up mode (`--warm-up all-rows`, the default: a trace per row count the batch is padded to before
/health says ready; `one-row`: the one-row step only) and each --clients level, a fresh `python -m serve` starts on
the same artifact, answers /health, and then gets --bursts bursts one after the other, each of `clients` streaming
/generate requests sent at once (the load test's prompts, seeded sampling, exactly --new-tokens tokens each).  A
burst's time to first token is its requests' median, its rate each request's tokens after the first over the time
from its first token to its last, median over the burst.  The figures compared are burst 1's against burst
--bursts' (the tenth by default), per server, median over --rounds fresh servers; the goal is a first burst within
2x of the tenth.  The host's read bandwidth and matmul rate are measured in the same run, and the load average
before every server.
"""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.eval.loadtest import exact_request_body, run_level
from bench.experiment import Experiment, ExperimentError, SettingsError
from bench.peers.host_rates import read_bandwidth
from bench.experiments.serve_speed import random_artifact
from bench.plots import plt
from bench.report_page import Page, decode_path, num, spread, timed_as
from model.config import PRESETS
from runtime.cli import check_options, non_default_flags, option
from runtime.timing import Environment, Spread, environment, matmul_rate
from serve.config import WARM_UP_CHOICES
from serve.launch import running_server

REQUEST_TIMEOUT_S = 600.0
STARTUP_TIMEOUT_S = 1800.0  # a busy 2-core host traces GPT-2 124M's row counts for minutes


@dataclass
class Settings:
    model: str = option("gpt2", "model preset (random weights)", choices=tuple(PRESETS))
    new_tokens: int = option(32, "tokens generated per request", min=2)
    clients: list[int] = option([1, 4], "requests per burst, sent at once", min=1)
    bursts: int = option(10, "bursts after start-up, one after the other; the last is compared with the first", min=2)
    rounds: int = option(1, "fresh servers per mode and level", min=1)
    warm_up: list[str] = option(list(WARM_UP_CHOICES), "the servers' --warm-up modes compared", choices=WARM_UP_CHOICES)
    max_batch_size: int = option(16, "the servers' --max-batch-size", min=1)

    def __post_init__(self):
        check_options(self, SettingsError)


@dataclass
class Burst:
    first_token_ms: float  # median over the burst's requests
    tokens_per_s: float  # per request, after its first token: median over the burst


@dataclass
class Case:
    warm_up: str
    clients: int
    startup_s: Spread  # from the process's start to /health answering
    first: list[Burst]  # burst 1 of each round
    last: list[Burst]  # burst --bursts of each round
    bursts_ms: list[list[float]]  # every burst's first-token time, per round: the curve the plot draws
    first_token_ratio: float  # median over rounds of burst 1's first token / the last burst's
    rate_ratio: float  # median over rounds of the last burst's rate / burst 1's


@dataclass
class FirstRequest:
    model: str
    new_tokens: int
    bursts: int
    cases: list[Case]
    read_bandwidth_gb_s: Spread  # the host's memory read rate (a sum over 1 GiB of float32)
    matmul_gflop_s: Spread  # the host's fp32 matmul rate (1024 x 1024 products), all threads
    load_average_1m: Spread  # before every server
    command: str
    environment: Environment


def burst(url: str, clients: int, new_tokens: int, index: int) -> Burst:
    body = lambda i, n: exact_request_body(index * clients + i, n)  # each burst its own prompts
    level = asyncio.run(run_level(url, clients, clients, new_tokens, REQUEST_TIMEOUT_S, REQUEST_TIMEOUT_S, body))
    bad = [o for o in level.outcomes if o.status != 200 or o.error or o.tokens != new_tokens]
    if bad or len(level.outcomes) != clients:
        raise ExperimentError(f"a request of burst {index + 1} failed: {bad[0] if bad else 'not sent'}")
    ttft = sorted(o.ttft_s for o in level.outcomes)
    rates = sorted((o.tokens - 1) / (o.latency_s - o.ttft_s) for o in level.outcomes)
    return Burst(1000 * ttft[len(ttft) // 2], rates[len(rates) // 2])


def one_server(artifact: Path, log: Path, warm_up: str, clients: int, settings: Settings) -> tuple[float, list[Burst]]:
    started = time.perf_counter()
    args = ["--device", "cpu", "--warm-up", warm_up, "--max-batch-size", str(settings.max_batch_size)]
    with running_server(artifact, log, args, startup_timeout_s=STARTUP_TIMEOUT_S) as server:
        startup_s = time.perf_counter() - started
        bursts = [burst(server.url, clients, settings.new_tokens, i) for i in range(settings.bursts)]
    return startup_s, bursts


def measure(settings: Settings, work_dir: Path) -> FirstRequest:
    artifact = random_artifact(settings.model, work_dir)
    read, matmul = read_bandwidth(), matmul_rate()
    runs: dict[tuple[str, int], list[tuple[float, list[Burst]]]] = {}
    loads = []
    for round_ in range(settings.rounds):
        for clients in settings.clients:
            modes = settings.warm_up if round_ % 2 == 0 else list(reversed(settings.warm_up))
            for mode in modes:
                loads.append(os.getloadavg()[0])
                startup_s, bursts = one_server(artifact, work_dir / f"server_{mode}_{clients}.log", mode, clients,
                                               settings)
                runs.setdefault((mode, clients), []).append((startup_s, bursts))
                print(f"round {round_ + 1}: --warm-up {mode}, {clients} client(s): start-up {startup_s:.1f}s, first "
                      f"token {bursts[0].first_token_ms:.0f} ms then {bursts[-1].first_token_ms:.0f} ms; "
                      f"{bursts[0].tokens_per_s:.1f} then {bursts[-1].tokens_per_s:.1f} tokens/s", flush=True)
    cases = []
    for (mode, clients), done in runs.items():
        first, last = [b[0] for _, b in done], [b[-1] for _, b in done]
        cases.append(Case(mode, clients, Spread.of([s for s, _ in done]), first, last,
                          [[b.first_token_ms for b in bursts] for _, bursts in done],
                          Spread.of([f.first_token_ms / t.first_token_ms for f, t in zip(first, last)]).median,
                          Spread.of([t.tokens_per_s / f.tokens_per_s for f, t in zip(first, last)]).median))
    command = " ".join(["python -m bench.experiments first_request", *non_default_flags(settings)])
    return FirstRequest(settings.model, settings.new_tokens, settings.bursts, cases, Spread.of(read),
                        Spread.of(matmul), Spread.of(loads), command, environment(torch.device("cpu")))


def plot(result: FirstRequest):
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    for case in result.cases:
        curve = [sorted(values)[len(values) // 2] for values in zip(*case.bursts_ms)]
        ax.plot(range(1, len(curve) + 1), curve, marker="o", label=f"--warm-up {case.warm_up}, {case.clients} client(s)")
    ax.set_yscale("log")
    ax.set_xlabel("burst after start-up")
    ax.set_ylabel("time to first token, ms (median)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(f"{result.model}: the first requests against later ones")
    return fig


def section(res: FirstRequest, page: Page) -> None:
    page.add(f"{res.model} (random weights), {res.new_tokens} new tokens per request, {res.bursts} bursts per fresh "
             f"server; load average {spread(res.load_average_1m, 2)}; host read rate "
             f"{spread(res.read_bandwidth_gb_s)} GB/s, matmul {spread(res.matmul_gflop_s)} GFLOP/s.\n")
    page.add(timed_as(f"`python -m serve --warm-up MODE` (the first column; all-rows is its default), "
                      f"{decode_path('auto')}",
                      "not overlapped: one fresh server at a time, and its first burst is timed, not a warm-up"))
    page.table(["--warm-up", "clients", "start-up s", "first token ms: burst 1", f"burst {res.bursts}",
                "burst 1 / last", "tokens/s: burst 1", f"burst {res.bursts}", "last / burst 1"],
               [[c.warm_up, c.clients, spread(c.startup_s), num(c.first[0].first_token_ms, 0),
                 num(c.last[0].first_token_ms, 0), f"{c.first_token_ratio:.2f}x", num(c.first[0].tokens_per_s),
                 num(c.last[0].tokens_per_s), f"{c.rate_ratio:.2f}x"] for c in res.cases])
    for c in res.cases:
        curve = [sorted(values)[len(values) // 2] for values in zip(*c.bursts_ms)]
        page.add(f"--warm-up {c.warm_up}, {c.clients} client(s): bursts 2-{len(curve)} took at most "
                 f"{max(curve[1:]) / curve[-1]:.1f}x the last burst's first-token time; burst 1, "
                 f"{curve[0] / curve[-1]:.1f}x.\n")


EXPERIMENT = Experiment(
    name="first_request", title="The first request after start-up against the tenth", about=__doc__,
    settings=Settings, quick=Settings(model="tiny", clients=[1, 4]), full=Settings(rounds=3), result=FirstRequest,
    measure=measure, plot=plot, section=section)
