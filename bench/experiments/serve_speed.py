"""Serving overhead: one streaming client against generate() on the same model, and many clients against one.

    python -m bench.experiments serve_speed                  # GPT-2 124M config, random weights, 128 new tokens,
                                                             # 1 client and 12 clients
    python -m bench.experiments serve_speed --model tiny --new-tokens 64 --clients 4 8 16

This process builds the model, saves it as an artifact, and times `generate()` on it (batch 1, KV cache,
prefill included, sampling as the load test's requests do: temperature 0.8, top-k 200, a seed).  It then
starts `python -m serve` on that artifact, on the same device, and times the load test's streaming
`/generate` requests, the first with the same prompt, settings and seed, all with `ignore_eos` so that each
makes exactly --new-tokens tokens, from a client on loopback: one client alone, then each --clients level
sending that many requests at once (the prompts differ in length, as real clients' do).  They are
timed in interleaved rounds (`generate()`, one client, each level), so load on the machine hits them alike;
ratios are medians of per-round ratios.  Throughput is new tokens over the round's wall time (for the
clients, from the first request sent to the last stream closed); latency and time to first token are the
client's own, over every request of every round.
"""
from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench.experiment import Experiment, ExperimentError, SettingsError, at_least
from bench.loadtest import PROMPTS, LevelResult, run_level
from bench.loadtest import request_body as load_test_body
from bench.record import plt
from bench.report_page import Page, spread
from data.tokenizer import encode
from model.artifact import save_artifact
from model.config import PRESETS, preset
from model.generate import generate
from model.gpt import GPT
from model.packed_linear import pack_for_inference
from model.sampling import SamplingParams
from runtime.cli import option
from runtime.device import choose_device
from runtime.provenance import provenance
from runtime.timing import Environment, Spread, environment, paired_ratio, time_interleaved
from serve.launch import running_server

REQUEST_TIMEOUT_S = 600.0


@dataclass
class Settings:
    model: str = option("gpt2", "model preset (random weights)", choices=tuple(PRESETS))
    new_tokens: int = option(128, "tokens generated per request")
    clients: list[int] = field(default_factory=lambda: [12], metadata={
        "help": "concurrency levels measured beside one client: that many requests sent at once"})
    repeats: int = option(3, "timed rounds (after one untimed warm-up round)")
    device: str = option("auto", "auto, cpu, cuda, ... (the server's too)")

    def __post_init__(self):
        at_least(self, 1, "new_tokens", "repeats")
        at_least(self, 2, "clients")


@dataclass
class Percentiles:
    p50: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values: list[float]) -> Percentiles:
        return cls(*(float(np.percentile(values, q)) for q in (50, 95, 99)))


@dataclass
class Level:
    clients: int
    tokens_per_s: Spread  # every client's new tokens over the round's wall time
    latency_ms: Percentiles  # per request, over every round
    first_token_ms: Percentiles
    over_one_client: float | None  # throughput against one client alone (None for the one-client level)


@dataclass
class ServeSpeed:
    model: str
    prompt: str
    prompt_tokens: int
    new_tokens: int
    generate_tokens_per_s: Spread
    levels: list[Level]  # one client first
    one_client_over_generate: float  # median of per-round ratios
    environment: Environment


def request_body(i: int, max_new_tokens: int) -> dict:
    """Request i of the load test (its prompt, temperature 0.8, top-k 200, seed i), streamed, and going on past
    end-of-text so that it makes exactly `max_new_tokens` tokens; request 0 is what generate() is timed on."""
    return {**load_test_body(i, max_new_tokens), "ignore_eos": True}


def checked(level: LevelResult, new_tokens: int) -> LevelResult:
    """A level in which every request made exactly `new_tokens` tokens, or an error naming the first failure."""
    for outcome in level.outcomes:
        if outcome.status != 200 or outcome.error or outcome.tokens != new_tokens:
            raise ExperimentError(f"a request at concurrency {level.concurrency} failed: status {outcome.status}, "
                                  f"{outcome.tokens} of {new_tokens} tokens, {outcome.error or 'no error text'}")
    return level


def measure(settings: Settings, work_dir: Path) -> ServeSpeed:
    device = choose_device(settings.device)
    torch.manual_seed(0)
    model = GPT(preset(settings.model)).to(device).eval()
    prompt = PROMPTS[0]
    prompt_ids = encode(prompt)
    if len(prompt_ids) + settings.new_tokens > model.config.block_size:
        raise SettingsError(f"--new-tokens {settings.new_tokens} and the prompt exceed the {settings.model} "
                            f"context of {model.config.block_size}")
    shutil.rmtree(work_dir, ignore_errors=True)  # this experiment's own scratch from last time
    work_dir.mkdir(parents=True)
    artifact = work_dir / "model"
    save_artifact(artifact, model, model.config, "float", provenance("bench/experiments/serve_speed.py"))
    pack_for_inference(model)  # as the server does with what it loads

    idx = torch.tensor([prompt_ids], device=device)
    first = request_body(0, settings.new_tokens)
    params = SamplingParams(max_new_tokens=settings.new_tokens, temperature=first["temperature"],
                            top_k=first["top_k"], seed=first["seed"], stop_at_eot=False)
    levels: dict[int, list[LevelResult]] = {n: [] for n in [1, *settings.clients]}
    server_args = ["--device", str(device), "--max-batch-size", str(max(16, *settings.clients)),
                   "--max-connections", str(max(128, 2 * max(settings.clients))),
                   "--request-timeout-s", str(REQUEST_TIMEOUT_S)]

    def clients(url: str, n: int):
        def call():
            levels[n].append(checked(asyncio.run(run_level(url, n, n, settings.new_tokens, REQUEST_TIMEOUT_S,
                                                           REQUEST_TIMEOUT_S, body=request_body)),
                                     settings.new_tokens))
        return call

    with running_server(artifact, work_dir / "server.log", server_args) as server:
        calls = {"generate": lambda: generate(model, idx, params), **{n: clients(server.url, n) for n in levels}}
        seconds = time_interleaved(calls, settings.repeats, warmup=1, device=device, progress="serve_speed rounds")
    timed = {n: runs[1:] for n, runs in levels.items()}  # the first round warmed up
    # The clients' own clock: from the first request sent to the last stream closed.
    wall = {n: [run.wall_s for run in runs] for n, runs in timed.items()}
    generate_speed = Spread.of([settings.new_tokens / s for s in seconds["generate"]])
    result_levels = []
    for n, runs in timed.items():
        outcomes = [o for run in runs for o in run.outcomes]
        result_levels.append(Level(
            n, Spread.of([n * settings.new_tokens / s for s in wall[n]]),
            Percentiles.of([1000 * o.latency_s for o in outcomes]),
            Percentiles.of([1000 * o.ttft_s for o in outcomes]),
            None if n == 1 else paired_ratio(wall[1], [s / n for s in wall[n]])))
    result = ServeSpeed(settings.model, prompt, len(prompt_ids), settings.new_tokens, generate_speed, result_levels,
                        paired_ratio(seconds["generate"], wall[1]), environment(device))
    print(f"generate(): {generate_speed.median:.1f} new tokens/s; one streaming client "
          f"{result_levels[0].tokens_per_s.median:.1f} ({result.one_client_over_generate:.2f}x generate())"
          + "".join(f"; {lv.clients} clients {lv.tokens_per_s.median:.1f} ({lv.over_one_client:.2f}x one)"
                    for lv in result_levels[1:]))
    return result


def plot(result: ServeSpeed):
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = ["generate()", *[f"{lv.clients} client{'s' if lv.clients > 1 else ''}" for lv in result.levels]]
    spreads = [result.generate_tokens_per_s, *[lv.tokens_per_s for lv in result.levels]]
    medians = [s.median for s in spreads]
    ax.bar(names, medians, yerr=[[m - s.min for m, s in zip(medians, spreads)],
                                 [s.max - m for m, s in zip(medians, spreads)]],
           capsize=6, color=["tab:grey", *["tab:blue"] * len(result.levels)])
    ax.set_ylabel("new tokens / s (min-max)")
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(f"{result.model}: {result.new_tokens} new tokens per request, sampled, streamed")
    return fig


def section(res: ServeSpeed, page: Page) -> None:
    page.add(f"`{res.model}` with random weights, prompt \"{res.prompt}\" ({res.prompt_tokens} tokens), "
             f"{res.new_tokens} new tokens per request, sampled (temperature 0.8, top-k 200); `generate()` in the benchmark's process against "
             f"streaming `/generate` requests to `python -m serve` on the same artifact and device, timed in "
             f"interleaved rounds.\n")
    rows = [["`generate()`, batch 1", spread(res.generate_tokens_per_s), "", "", ""]]
    for lv in res.levels:
        over = (f"{res.one_client_over_generate:.2f}x `generate()`" if lv.over_one_client is None
                else f"{lv.over_one_client:.2f}x one client")
        rows.append([f"{lv.clients} streaming client{'s' if lv.clients > 1 else ''}", spread(lv.tokens_per_s), over,
                     " / ".join(f"{v:.0f}" for v in (lv.latency_ms.p50, lv.latency_ms.p95, lv.latency_ms.p99)),
                     " / ".join(f"{v:.0f}" for v in (lv.first_token_ms.p50, lv.first_token_ms.p95,
                                                     lv.first_token_ms.p99))])
    page.table(["", "new tokens/s (min-max)", "ratio", "latency p50 / p95 / p99 ms",
                "first token p50 / p95 / p99 ms"], rows)
    page.add(f"**One streaming client gets {res.one_client_over_generate:.2f}x of `generate()`'s speed**: the "
             f"server's per-token cost (HTTP, event stream, the engine's batching bookkeeping) over the bare "
             f"decoding loop.\n")


EXPERIMENT = Experiment(
    name="serve_speed", title="Serving against generate()", about=__doc__, settings=Settings,
    quick=Settings(new_tokens=64, repeats=2), full=Settings(),
    result=ServeSpeed, measure=measure, plot=plot, section=section,
    gpu=Settings(clients=[12, 32], repeats=5))
