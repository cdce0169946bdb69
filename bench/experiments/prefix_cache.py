"""Prefix caching (issue 51): the same server with its prefix cache (`--prefix-cache-mb 256`) and without
(`--prefix-cache-mb 0`, the default), on two workloads whose prompts share their starts.

    python -m bench.experiments prefix_cache            # GPT-2 124M config, random weights

- Scoring, as lm-evaluation-harness's loglikelihood requests come: --contexts contexts of --context-tokens tokens,
  each with --continuations continuations of --continuation-tokens tokens, one request per continuation (the
  context and the continuation as token ids, echo, logprobs 1, max_tokens 0), sent one after the other.  Figure:
  requests per second.
- Few-shot generation: a --prefix-tokens shared prefix (the examples) and short questions (--question-tokens),
  streaming greedy /v1/completions of --new-tokens tokens, --questions of them at each --clients level (that many at
  once).  Figure: time to first token, median over the level's requests (the first of a round computes the prefix).

Prompts are random token ids from a seeded generator, new in every round, so that a round reuses only what its own
requests share.  Both servers run at once on the same artifact, and in every round each workload runs on one
then the other, in an order reversed every other round; the speed-ups are medians of per-round ratios.  Each
server gets one untimed round first (its first row counts' traces, its first prompts).  The host's read bandwidth
and matmul rate are measured in the same run.  llama-server is not compared here: no llama.cpp build was at hand
on the measuring host (bench/peers/llama_cpp_peer.py says how to build one).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from bench.eval.loadtest import completion_body, run_level, server_metrics
from bench.experiment import Experiment, ExperimentError, RandomWeightsSettings
from bench.peers.host_rates import read_bandwidth
from bench.experiments.serve_speed import random_fp32_artifact
from bench.plots import finish, grouped_bars, plt
from bench.report_page import Page, spread
from runtime.cli import non_default_flags, option
from runtime.timing import Environment, Spread, environment, matmul_rate, paired_ratio
from serve.launch import running_server

MODEL_ID = "model"
REQUEST_TIMEOUT_S = 600.0
SIDES = ("off", "on")  # --prefix-cache-mb 0 and 256


@dataclass
class Settings(RandomWeightsSettings):
    rounds: int = option(2, "timed rounds (after one untimed round)", min=1)
    contexts: int = option(4, "scoring: contexts per round", min=1)
    context_tokens: int = option(100, "scoring: tokens per context", min=1)
    continuations: int = option(4, "scoring: continuations per context (a 4-choice task)", min=1)
    continuation_tokens: int = option(20, "scoring: tokens per continuation", min=1)
    prefix_tokens: int = option(400, "few-shot: tokens of the shared prefix", min=1)
    question_tokens: int = option(16, "few-shot: tokens per question", min=1)
    questions: int = option(4, "few-shot: requests per level per round", min=1)
    clients: list[int] = option([1, 4], "few-shot: requests at once", min=1)
    new_tokens: int = option(8, "few-shot: tokens generated per request", min=1)


@dataclass
class Side:
    prefix_cache: str  # "off" or "on"
    scoring_requests_per_s: Spread  # per round
    first_token_ms: dict[str, Spread]  # few-shot, by level ("1 client"): median per round
    prefix_hits: float  # from /metrics at the end
    reused_tokens: float


@dataclass
class PrefixCacheResult:
    model: str
    settings: dict
    sides: list[Side]
    scoring_speedup: float  # on over off, median of per-round ratios of requests per second
    first_token_speedup: dict[str, float]  # off's time over on's, per level
    read_bandwidth_gb_s: Spread
    matmul_gflop_s: Spread
    load_average_1m: Spread
    command: str
    environment: Environment


def token_ids(count: int, generator: torch.Generator) -> list[int]:
    return torch.randint(0, 50000, (count,), generator=generator).tolist()


def scoring(url: str, settings: Settings, generator: torch.Generator) -> float:
    """Requests per second over the round's scoring requests, sent one after the other."""
    bodies = []
    for _ in range(settings.contexts):
        context = token_ids(settings.context_tokens, generator)
        bodies += [{"model": MODEL_ID, "prompt": context + token_ids(settings.continuation_tokens, generator),
                    "echo": True, "logprobs": 1, "max_tokens": 0, "temperature": 0}
                   for _ in range(settings.continuations)]
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        start = time.perf_counter()
        for body in bodies:
            response = client.post(f"{url}/v1/completions", json=body)
            if response.status_code != 200:
                raise ExperimentError(f"a scoring request failed: {response.status_code} {response.text[:300]}")
        return len(bodies) / (time.perf_counter() - start)


def few_shot(url: str, settings: Settings, clients: int, generator: torch.Generator) -> float:
    """The median time to first token (ms) over one level's requests."""
    prefix = token_ids(settings.prefix_tokens, generator)
    prompts = [prefix + token_ids(settings.question_tokens, generator) for _ in range(settings.questions)]
    body = lambda i, n: completion_body(MODEL_ID, prompts[i], n)
    level = asyncio.run(run_level(url, clients, settings.questions, settings.new_tokens, REQUEST_TIMEOUT_S,
                                  REQUEST_TIMEOUT_S, body, route="/v1/completions"))
    if len(level.ok) != settings.questions:
        raise ExperimentError(f"a few-shot request failed: {next(o for o in level.outcomes if o.error)}")
    times = sorted(1000 * o.ttft_s for o in level.ok)
    return times[len(times) // 2]


def measure(settings: Settings, work_dir: Path) -> PrefixCacheResult:
    artifact = random_fp32_artifact(settings.model, work_dir)
    read, matmul = read_bandwidth(), matmul_rate()
    levels = [f"{c} client{'s' if c > 1 else ''}" for c in settings.clients]
    rates = {side: [] for side in SIDES}
    firsts = {(side, level): [] for side in SIDES for level in levels}
    loads = []
    with contextlib.ExitStack() as servers:
        urls = {side: servers.enter_context(running_server(
            artifact, work_dir / f"server_{side}.log", ["--device", "cpu", "--warm-up", "one-row", "--served-model-name",
                                                        MODEL_ID, "--prefix-cache-mb", "0" if side == "off" else "256"],
            startup_timeout_s=REQUEST_TIMEOUT_S)).url for side in SIDES}
        for round_ in range(settings.rounds + 1):
            loads.append(os.getloadavg()[0])
            for side in SIDES if round_ % 2 == 0 else reversed(SIDES):
                generator = torch.Generator().manual_seed(round_)  # the same prompts on both sides
                rate = scoring(urls[side], settings, generator)
                first = [few_shot(urls[side], settings, clients, generator) for clients in settings.clients]
                if round_ == 0:
                    continue  # untimed
                rates[side].append(rate)
                for level, ms in zip(levels, first):
                    firsts[(side, level)].append(ms)
                print(f"round {round_}/{settings.rounds}, prefix cache {side}: scoring {rate:.2f} requests/s; few-shot "
                      f"first token {', '.join(f'{level} {ms:.0f} ms' for level, ms in zip(levels, first))}",
                      flush=True)
        sides = [Side(side, Spread.of(rates[side]), {level: Spread.of(firsts[(side, level)]) for level in levels},
                      *server_metrics(urls[side], "serve_prefix_cache_hits_total",
                                      "serve_prefix_cache_reused_tokens_total")) for side in SIDES]
    command = " ".join(["python -m bench.experiments prefix_cache", *non_default_flags(settings)])
    return PrefixCacheResult(
        settings.model, {k: v for k, v in vars(settings).items()}, sides, paired_ratio(rates["on"], rates["off"]),
        {level: paired_ratio(firsts[("off", level)], firsts[("on", level)]) for level in levels},
        Spread.of(read), Spread.of(matmul), Spread.of(loads), command, environment(torch.device("cpu")))


def plot(result: PrefixCacheResult):
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
    left.bar(SIDES, [s.scoring_requests_per_s.median for s in result.sides], color=["grey", "tab:blue"])
    left.set_ylabel("scoring requests/s (median)")
    left.set_title("echo + logprobs, max_tokens 0")
    levels = list(result.first_token_speedup)
    grouped_bars(right, levels, {f"prefix cache {side.prefix_cache}": [side.first_token_ms[lv] for lv in levels]
                                 for side in result.sides})
    right.set_ylabel("few-shot first token, ms (median, min-max)")
    right.legend(fontsize=8)
    return finish(fig, (left, right), f"{result.model}: prefix caching off and on", grid="y")


def section(res: PrefixCacheResult, page: Page) -> None:
    s = res.settings
    page.add(f"{res.model} (random weights). Scoring: {s['contexts']} contexts of {s['context_tokens']} tokens x "
             f"{s['continuations']} continuations of {s['continuation_tokens']} per round. Few-shot: a "
             f"{s['prefix_tokens']}-token shared prefix, {s['question_tokens']}-token questions, {s['new_tokens']} new "
             f"tokens. {s['rounds']} rounds; load average {spread(res.load_average_1m, 2)}; host read rate "
             f"{spread(res.read_bandwidth_gb_s)} GB/s, matmul {spread(res.matmul_gflop_s)} GFLOP/s.\n")
    levels = list(res.first_token_speedup)
    page.table(["prefix cache", "scoring requests/s", *(f"few-shot first token ms, {lv}" for lv in levels),
                "prefix hits", "reused tokens"],
               [[side.prefix_cache, spread(side.scoring_requests_per_s, 2),
                 *(spread(side.first_token_ms[lv], 0) for lv in levels), f"{side.prefix_hits:g}",
                 f"{side.reused_tokens:g}"] for side in res.sides])
    page.add(f"Speed-up with the cache (medians of per-round ratios): scoring {res.scoring_speedup:.2f}x; few-shot "
             f"first token {', '.join(f'{lv} {r:.2f}x' for lv, r in res.first_token_speedup.items())}.\n")


EXPERIMENT = Experiment(
    name="prefix_cache", title="Prefix caching: scoring and few-shot prompts, with and without reuse", about=__doc__,
    settings=Settings, quick=Settings(model="tiny", rounds=1, prefix_tokens=200), full=Settings(rounds=5),
    result=PrefixCacheResult, measure=measure, plot=plot, section=section)
