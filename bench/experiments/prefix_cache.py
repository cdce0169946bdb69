"""Prefix caching (issues 51 and 69): the same server with its prefix cache (its default budget) and without
(`--prefix-cache-mb 0`), on two workloads whose prompts share their starts and one whose prompts share nothing.

    python -m bench.experiments prefix_cache            # GPT-2 124M config, random weights

- Scoring, as lm-evaluation-harness's loglikelihood requests come: --contexts contexts of --context-tokens tokens,
  each with --continuations continuations of --continuation-tokens tokens, one request per continuation (the
  context and the continuation as token ids, echo, logprobs 1, max_tokens 0), sent one after the other.  Figure:
  requests per second.
- Few-shot generation: a --prefix-tokens shared prefix (the examples) and short questions (--question-tokens),
  streaming greedy /v1/completions of --new-tokens tokens, --questions of them at each --clients level (that many at
  once).  Figure: time to first token, median over the level's requests (the first of a round computes the prefix).
- Unshared prompts, what the cache costs when nothing is reused: --plain-requests prompts of --plain-tokens tokens
  with nothing in common, greedy /v1/completions of --new-tokens tokens, sent one after the other.  Figure: requests
  per second (each stores its blocks, evicting older ones once the budget is full).

Prompts are random token ids from a seeded generator, new in every round, so that a round reuses only what its own
requests share.  Both servers run at once on the same artifact, and in every round each workload runs on one
then the other, in an order reversed every other round; the speed-ups are medians of per-round ratios.  Each
server gets one untimed round first (its first row counts' traces, its first prompts).  The host's read bandwidth
and matmul rate are measured in the same run.

    .peers/venv/bin/python -m bench.experiments prefix_cache --llama-server .peers/llama-server

With --llama-server, the few-shot workload also runs against llama.cpp's llama-server on the same weights (the
artifact written as an F32 GGUF file by bench/peers/llama_cpp_peer.py), one server per --clients level with a slot
per client, otherwise started as serve_speed starts it (llama_cpp_peer's SERVER_SETUP).  Its defaults keep each
slot's prompt (`cache_prompt`) and compute only what the next request's prompt adds to their common start, with a
host-memory prompt cache besides (`--cache-ram`).  It runs beside ours, gets the same token ids in the same rounds,
in the same order reversed every other round, and an untimed first round too; the speed-up of ours with the cache
over it is a median of per-round ratios, like the others.  Scoring stays ours only: llama-server's
/v1/completions refuses `echo` ("Only no echo is supported"), and its /completion's `n_probs` gives probabilities
of generated tokens only, never of the prompt's, so neither answers a scoring request (the prompt's
log-probabilities, echo with logprobs and max_tokens 0).
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

from bench.eval.loadtest import completion_body, level_name, run_level, server_metrics
from bench.experiment import Experiment, ExperimentError, RandomWeightsSettings, SettingsError
from bench.peers.host_rates import read_bandwidth
from bench.peers.llama_cpp_peer import (SERVER_SETUP, check_llama_server, llama_server_command, llama_server_version,
                                        write_gguf)
from bench.experiments.serve_speed import random_artifact
from bench.plots import finish, grouped_bars, plt
from bench.report_page import Page, decode_path, spread, timed_as
from runtime.cli import non_default_flags, option
from runtime.timing import Environment, Spread, environment, matmul_rate, paired_ratio
from serve.launch import ServerProcess, running, running_server
from storage.artifact import load_model

MODEL_ID = "model"
REQUEST_TIMEOUT_S = 600.0
SIDES = ("off", "on")  # --prefix-cache-mb 0, and the default
PEER = "llama-server"


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
    new_tokens: int = option(8, "few-shot and unshared: tokens generated per request", min=1)
    plain_requests: int = option(8, "unshared: requests per round", min=1)
    plain_tokens: int = option(100, "unshared: tokens per prompt", min=1)
    llama_server: str | None = option(None, "llama.cpp's llama-server binary: run the few-shot workload on it too, "
                                            "on the same weights as F32 GGUF")

    def __post_init__(self):
        super().__post_init__()
        check_llama_server(self.llama_server, SettingsError)


@dataclass
class Side:
    prefix_cache: str  # "off" or "on"
    scoring_requests_per_s: Spread  # per round
    first_token_ms: dict[str, Spread]  # few-shot, by level ("1 client"): median per round
    prefix_hits: float  # from /metrics at the end
    reused_tokens: float
    plain_requests_per_s: Spread | None = None  # unshared prompts, per round (results before issue 69 lack it)


@dataclass
class PeerFewShot:
    peer: str  # llama-server's build, and the GGUF format it served
    setup: str
    first_token_ms: dict[str, Spread]  # by level, as Side's
    first_token_speedup: dict[str, float]  # its time over ours with the cache, per level


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
    llama_server: PeerFewShot | None = None  # with --llama-server
    plain_speedup: float | None = None  # unshared prompts: on over off, median of per-round ratios


def token_ids(count: int, generator: torch.Generator) -> list[int]:
    return torch.randint(0, 50000, (count,), generator=generator).tolist()


def scoring_bodies(settings: Settings, generator: torch.Generator) -> list[dict]:
    bodies = []
    for _ in range(settings.contexts):
        context = token_ids(settings.context_tokens, generator)
        bodies += [{"model": MODEL_ID, "prompt": context + token_ids(settings.continuation_tokens, generator),
                    "echo": True, "logprobs": 1, "max_tokens": 0, "temperature": 0}
                   for _ in range(settings.continuations)]
    return bodies


def few_shot_prompts(settings: Settings, generator: torch.Generator) -> list[list[int]]:
    """One level's prompts: a shared prefix of its own, then each request's question."""
    prefix = token_ids(settings.prefix_tokens, generator)
    return [prefix + token_ids(settings.question_tokens, generator) for _ in range(settings.questions)]


def plain_bodies(settings: Settings, generator: torch.Generator) -> list[dict]:
    return [{"model": MODEL_ID, "prompt": token_ids(settings.plain_tokens, generator), "max_tokens": settings.new_tokens,
             "temperature": 0, "ignore_eos": True} for _ in range(settings.plain_requests)]


def requests_per_s(url: str, bodies: list[dict], workload: str) -> float:
    """Requests per second over a round's `workload` requests, sent one after the other."""
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        start = time.perf_counter()
        for body in bodies:
            response = client.post(f"{url}/v1/completions", json=body)
            if response.status_code != 200:
                raise ExperimentError(f"a {workload} request failed: {response.status_code} {response.text[:300]}")
        return len(bodies) / (time.perf_counter() - start)


def few_shot(url: str, settings: Settings, clients: int, prompts: list[list[int]]) -> float:
    """The median time to first token (ms) over one level's requests."""
    body = lambda i, n: completion_body(MODEL_ID, prompts[i], n)
    level = asyncio.run(run_level(url, clients, settings.questions, settings.new_tokens, REQUEST_TIMEOUT_S,
                                  REQUEST_TIMEOUT_S, body, route="/v1/completions"))
    if len(level.ok) != settings.questions:
        raise ExperimentError(f"a few-shot request failed: {next(o for o in level.outcomes if o.error)}")
    times = sorted(1000 * o.ttft_s for o in level.ok)
    return times[len(times) // 2]


def llama_servers(settings: Settings, artifact: Path, work_dir: Path, servers: contextlib.ExitStack) -> dict[int, str]:
    """The URL of a llama-server on `artifact`'s weights for each --clients level, with a slot per client, started in
    `servers`."""
    gguf = write_gguf(load_model(artifact)[0], work_dir / f"{artifact.name}.gguf")
    context = settings.prefix_tokens + settings.question_tokens + settings.new_tokens
    return {clients: servers.enter_context(running(ServerProcess.start(
        llama_server_command(Path(settings.llama_server), gguf, clients, context, torch.get_num_threads()),
        work_dir / f"llama_server_{clients}.log"), REQUEST_TIMEOUT_S)).url for clients in settings.clients}


def measure(settings: Settings, work_dir: Path) -> PrefixCacheResult:
    artifact = random_artifact(settings.model, work_dir)
    read, matmul = read_bandwidth(), matmul_rate()
    levels = [level_name(c) for c in settings.clients]
    sides = [*SIDES, PEER] if settings.llama_server else list(SIDES)
    rates = {side: [] for side in SIDES}
    plain_rates = {side: [] for side in SIDES}
    firsts = {(side, level): [] for side in sides for level in levels}
    loads = []
    with contextlib.ExitStack() as servers:
        ours = {side: servers.enter_context(running_server(
            artifact, work_dir / f"server_{side}.log", ["--device", "cpu", "--warm-up", "one-row", "--served-model-name",
                                                        MODEL_ID, *(["--prefix-cache-mb", "0"] if side == "off" else [])],
            startup_timeout_s=REQUEST_TIMEOUT_S)).url for side in SIDES}
        urls = {(side, clients): url for side, url in ours.items() for clients in settings.clients}
        if settings.llama_server:
            urls.update({(PEER, clients): url
                         for clients, url in llama_servers(settings, artifact, work_dir, servers).items()})
        for round_ in range(settings.rounds + 1):
            loads.append(os.getloadavg()[0])
            # The same prompts on every side; a new prefix for each level, so that no level reuses another's.
            generator = torch.Generator().manual_seed(round_)
            bodies = scoring_bodies(settings, generator)
            prompts = [few_shot_prompts(settings, generator) for _ in settings.clients]
            plain = plain_bodies(settings, generator)
            for side in sides if round_ % 2 == 0 else reversed(sides):
                rate = requests_per_s(ours[side], bodies, "scoring") if side in ours else None
                plain_rate = requests_per_s(ours[side], plain, "unshared") if side in ours else None
                first = [few_shot(urls[side, clients], settings, clients, level_prompts)
                         for clients, level_prompts in zip(settings.clients, prompts)]
                if round_ == 0:
                    continue  # untimed
                if rate is not None:
                    rates[side].append(rate)
                    plain_rates[side].append(plain_rate)
                for level, ms in zip(levels, first):
                    firsts[(side, level)].append(ms)
                print(f"round {round_}/{settings.rounds}, {PEER if side == PEER else f'prefix cache {side}'}: "
                      + ("" if rate is None else f"scoring {rate:.2f} requests/s; unshared {plain_rate:.2f} "
                                                 f"requests/s; ") + "few-shot first token "
                      + ", ".join(f"{level} {ms:.0f} ms" for level, ms in zip(levels, first)), flush=True)
        results = [Side(side, Spread.of(rates[side]), {level: Spread.of(firsts[(side, level)]) for level in levels},
                        *server_metrics(ours[side], "serve_prefix_cache_hits_total",
                                        "serve_prefix_cache_reused_tokens_total"), Spread.of(plain_rates[side]))
                   for side in SIDES]
    peer = None
    if settings.llama_server:
        peer = PeerFewShot(f"{PEER} {llama_server_version(Path(settings.llama_server))}, F32", SERVER_SETUP,
                           {level: Spread.of(firsts[(PEER, level)]) for level in levels},
                           {level: paired_ratio(firsts[(PEER, level)], firsts[("on", level)]) for level in levels})
    command = " ".join(["python -m bench.experiments prefix_cache", *non_default_flags(settings)])
    return PrefixCacheResult(
        settings.model, {k: v for k, v in vars(settings).items()}, results, paired_ratio(rates["on"], rates["off"]),
        {level: paired_ratio(firsts[("off", level)], firsts[("on", level)]) for level in levels},
        Spread.of(read), Spread.of(matmul), Spread.of(loads), command, environment(torch.device("cpu")), peer,
        paired_ratio(plain_rates["on"], plain_rates["off"]))


def plot(result: PrefixCacheResult):
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
    left.bar(SIDES, [s.scoring_requests_per_s.median for s in result.sides], color=["grey", "tab:blue"])
    left.set_ylabel("scoring requests/s (median)")
    left.set_title("echo + logprobs, max_tokens 0")
    levels = list(result.first_token_speedup)
    groups = {f"prefix cache {side.prefix_cache}": [side.first_token_ms[lv] for lv in levels] for side in result.sides}
    if result.llama_server:
        groups[f"{PEER}, its defaults"] = [result.llama_server.first_token_ms[lv] for lv in levels]
    grouped_bars(right, levels, groups)
    right.set_ylabel("few-shot first token, ms (median, min-max)")
    right.legend(fontsize=8)
    return finish(fig, (left, right), f"{result.model}: prefix caching off and on"
                                      + (f", and {PEER}" if result.llama_server else ""), grid="y")


def section(res: PrefixCacheResult, page: Page) -> None:
    s = res.settings
    page.add(f"{res.model} (random weights). Scoring: {s['contexts']} contexts of {s['context_tokens']} tokens x "
             f"{s['continuations']} continuations of {s['continuation_tokens']} per round. Few-shot: a "
             f"{s['prefix_tokens']}-token shared prefix, {s['question_tokens']}-token questions, {s['new_tokens']} new "
             f"tokens. Unshared: {s.get('plain_requests', 'no')} prompts of {s.get('plain_tokens', 0)} tokens with "
             f"nothing in common. Cache on is the server's default budget. {s['rounds']} rounds; load average {spread(res.load_average_1m, 2)}; host read rate "
             f"{spread(res.read_bandwidth_gb_s)} GB/s, matmul {spread(res.matmul_gflop_s)} GFLOP/s.\n")
    page.add(timed_as(f"`python -m serve --warm-up one-row`, {decode_path('auto')}, the cache on (its default "
                      f"budget) or off; llama-server its own way",
                      "not overlapped: each server started and warmed up alone, after the one before it answered "
                      "/health; the first round is untimed"))
    levels = list(res.first_token_speedup)
    peer = res.llama_server
    unshared = lambda side: "n/a" if side.plain_requests_per_s is None else spread(side.plain_requests_per_s, 2)
    page.table(["prefix cache", "scoring requests/s", *(f"few-shot first token ms, {lv}" for lv in levels),
                "unshared requests/s", "prefix hits", "reused tokens"],
               [[side.prefix_cache, spread(side.scoring_requests_per_s, 2),
                 *(spread(side.first_token_ms[lv], 0) for lv in levels), unshared(side), f"{side.prefix_hits:g}",
                 f"{side.reused_tokens:g}"] for side in res.sides]
               # llama-server cannot score (the docstring says why) and counts no prefix hits of ours.
               + ([[peer.peer, "n/a", *(spread(peer.first_token_ms[lv], 0) for lv in levels), "n/a", "n/a", "n/a"]]
                  if peer else []))
    page.add(f"Speed-up with the cache (medians of per-round ratios): scoring {res.scoring_speedup:.2f}x; few-shot "
             f"first token {', '.join(f'{lv} {r:.2f}x' for lv, r in res.first_token_speedup.items())}"
             + ("" if res.plain_speedup is None else f"; unshared prompts {res.plain_speedup:.2f}x") + ".\n")
    if peer:
        page.add(f"Against {peer.peer} on the same weights ({peer.setup}), the same few-shot token ids in the same "
                 f"rounds: ours with the cache over llama-server, first token (medians of per-round ratios): "
                 f"{', '.join(f'{lv} {r:.2f}x' for lv, r in peer.first_token_speedup.items())}.\n")


EXPERIMENT = Experiment(
    name="prefix_cache", title="Prefix caching: scoring, few-shot and unshared prompts, with and without reuse", about=__doc__,
    settings=Settings, quick=Settings(model="tiny", rounds=1, prefix_tokens=200, plain_requests=2),
    full=Settings(rounds=5),
    result=PrefixCacheResult, measure=measure, plot=plot, section=section)
