"""The fused fp32 decode step (bench/fused_decode_step.py: the traced step compiled by TorchInductor with freezing and
cpp_wrapper, today's packed products fixed inside its graph) against the traced step (decode/trace.py), the
fastest fixed fp32 path on the CPU today: issue 70's trial of fusing the small operators around the products.

    python -m bench.experiments fused_step        # GPT-2 124M (random weights), batches 1, 4 and 12

In one process: the preset with random weights (seeded), its linear layers packed as sample.py packs them, a
seeded random prompt per row prefilled into one KV cache per side.  For each batch size, the traced step is made
first (its trace times the products' kernels, which the fused step then takes as they are), then the fused one:
its compile (Dynamo, Inductor and the C++ compiler, with the first run) is timed on an empty Inductor cache, a
folder of this experiment's own (`--work-dir`/inductor; the project's own processes use .cache/inductor).  Their
logits for the same token over the same cache are compared (the largest absolute difference), and so are their
greedy tokens.  Then the two are timed in interleaved rounds, the order reversed every other round: each round
runs `--steps` greedy steps of each side from the prompt's end (the same lengths for both), all threads, no
thread choice between steps; ms per step and new tokens/s are medians over rounds, the speed-up the median of
per-round ratios.  Each batch size's rows record the host's read and matmul rates, measured in a fresh process
just before its rounds (bench/peers/host_rates.py), and the 1-minute load average as each round began.

Last, a second fresh process (bench/workloads/fused_compile.py) compiles the same steps (the same kernels) over the
cache the first left: whether a second process pays the compile again.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiment import Experiment, ExperimentError, RandomWeightsSettings
from bench.peers.host_rates import HostRates, measure_in_process
from bench.plots import finish, grouped_bars, plt
from bench.processes import run_command
from bench.report_page import Page, spread
from bench.fused_decode_step import CACHE_ENV, COMPILE_OPTIONS, FusedSteps
from decode.trace import TracedSteps
from model.config import preset
from model.gpt import GPT
from model.kv_cache import KVCache
from model.packed_linear import CHOICES, pack_for_inference
from runtime.cli import non_default_flags, option
from runtime.timing import Environment, Spread, environment, paired_ratio

SIDES = ("traced", "fused")


@dataclass
class Settings(RandomWeightsSettings):
    batch_sizes: list[int] = option([1, 4, 12], "rows decoded together", min=1)
    prompt_tokens: int = option(32, "prompt length (seeded random tokens)", min=1)
    steps: int = option(64, "greedy steps of each side per timed round", min=1)
    rounds: int = option(7, "interleaved timed rounds per batch size", min=1)
    second_process: bool = option(True, "compile again in a fresh process over the cache the first one left "
                                        "(--no-second-process: not measured)")


@dataclass
class Compile:
    batch: int
    traced_s: float  # the trace, its kernels' timing and first runs included
    first_process_s: float  # the fused step's compile and first run, on an empty Inductor cache
    second_process_s: float | None  # the same in a fresh process over the cache the first left (None: not run)


@dataclass
class Row:
    batch: int
    host_rates: HostRates  # measured in a fresh process just before the rounds
    load_average: list[float]  # the 1-minute load average as each round began
    ms_per_step: dict[str, Spread]  # side -> ms per step, over the rounds
    tokens_per_s: dict[str, Spread]  # side -> new tokens/s (rows x steps / the round's time)
    fused_speedup: float  # median over rounds of the traced round's time / the fused one's
    max_abs_diff: float  # between the two sides' logits for the same token over the same cache
    identical_tokens: bool  # the two sides' greedy tokens over the first round


@dataclass
class FusedStep:
    model: str
    prompt_tokens: int
    steps: int
    rounds: int
    threads: int
    compile_options: dict[str, bool]  # Inductor's settings
    graphs: int  # graphs Dynamo made of the step per row count (1: the whole step in one graph)
    graph_breaks: list[str]  # why Dynamo broke the step's graph, if it did
    cache_folder: str  # the Inductor cache this run compiled into (the product's: .cache/inductor)
    cache_mb: float  # its size after the first process's compiles
    # Inductor's FX graph cache hits, misses and bypasses in the second process: a hit skips Inductor's lowering,
    # code generation and C++ compile, not Dynamo's capture, AOTAutograd or the freezing passes
    second_process_cache: dict[str, int]
    compiles: list[Compile]
    rows: list[Row]
    command: str
    environment: Environment


def _max_len(settings: Settings) -> int:
    """The KV cache's positions: a compiled step is made for its views' strides, so the second process's is the same."""
    return settings.prompt_tokens + settings.steps + 1


def _prefilled(model: GPT, batch: int, settings: Settings) -> KVCache:
    cache = KVCache.allocate(model.config, batch, _max_len(settings), "cpu")
    prompt = torch.randint(0, model.config.vocab_size, (batch, settings.prompt_tokens),
                           generator=torch.Generator().manual_seed(batch))
    model(prompt, cache=cache, last_only=True)
    return cache


def _round(run, cache: KVCache, first: torch.Tensor, prompt_tokens: int, steps: int) -> tuple[float, list]:
    """`steps` greedy steps of `run` (a side's step) from the prompt's end: seconds, and the tokens."""
    cache.truncate(torch.full_like(cache.lengths, prompt_tokens))
    token, tokens = first, []
    start = time.perf_counter()
    for _ in range(steps):
        token = run(cache, token)[:, -1].argmax(-1, keepdim=True)
        tokens.append(token)
    seconds = time.perf_counter() - start
    return seconds, torch.cat(tokens, 1).tolist()


@torch.inference_mode()  # as generate() and the server run their steps
def _row(model: GPT, sides: dict, batch: int, settings: Settings) -> tuple[Row, dict[str, float]]:
    caches = {name: _prefilled(model, batch, settings) for name in SIDES}
    first = torch.zeros(batch, 1, dtype=torch.long)
    setup, logits = {}, {}
    for name in SIDES:  # the traced step first: its trace times the kernels the fused step then takes
        before = sides[name].setup_s
        logits[name] = sides[name].step(caches[name], first)
        setup[name] = sides[name].setup_s - before
    diff = float((logits["traced"] - logits["fused"]).abs().max())
    rates = measure_in_process(torch.get_num_threads())
    seconds: dict[str, list[float]] = {name: [] for name in SIDES}
    tokens, loads = {}, []
    for round_ in range(settings.rounds):
        loads.append(os.getloadavg()[0])
        for name in SIDES if round_ % 2 == 0 else SIDES[::-1]:
            took, tokens[name] = _round(sides[name].step, caches[name], first, settings.prompt_tokens,
                                        settings.steps)
            seconds[name].append(took)
        print(f"batch {batch:>2}, round {round_ + 1}/{settings.rounds}: " + ", ".join(
            f"{name} {seconds[name][-1] / settings.steps * 1e3:.2f} ms/step" for name in SIDES), flush=True)
        if round_ == 0:
            identical = tokens["traced"] == tokens["fused"]
    row = Row(batch, rates, loads,
              {name: Spread.of([s / settings.steps * 1e3 for s in seconds[name]]) for name in SIDES},
              {name: Spread.of([batch * settings.steps / s for s in seconds[name]]) for name in SIDES},
              paired_ratio(seconds["traced"], seconds["fused"]), diff, identical)
    return row, setup


def _second_process(settings: Settings, work_dir: Path, kernels: list) -> dict:
    chosen = work_dir / "kernels.json"
    chosen.write_text(json.dumps(kernels))
    done = run_command([sys.executable, "-m", "bench.workloads.fused_compile", settings.model,
                        str(settings.prompt_tokens), str(_max_len(settings)), str(chosen),
                        *map(str, settings.batch_sizes)],
                       threads=torch.get_num_threads())
    if not done.ok:
        raise ExperimentError(f"the second process's compile failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


def measure(settings: Settings, work_dir: Path) -> FusedStep:
    work_dir.mkdir(parents=True, exist_ok=True)
    cache = (work_dir / "inductor").resolve()
    shutil.rmtree(cache, ignore_errors=True)  # the first process compiles on an empty cache
    os.environ[CACHE_ENV] = str(cache)
    torch.manual_seed(0)
    model = GPT(preset(settings.model)).eval()
    pack_for_inference(model)
    sides = {"traced": TracedSteps(model), "fused": FusedSteps(model)}
    rows, compiles = [], []
    for batch in settings.batch_sizes:
        row, setup = _row(model, sides, batch, settings)
        rows.append(row)
        compiles.append(Compile(batch, setup["traced"], setup["fused"], None))
    from torch._dynamo.utils import counters  # here: importing Dynamo sets $TORCHINDUCTOR_CACHE_DIR
    graphs = counters["stats"]["unique_graphs"] // len(settings.batch_sizes)
    breaks = sorted(counters["graph_break"])
    cache_mb = _folder_mb(cache)
    second = {"cache_hits": 0, "cache_misses": 0, "cache_bypasses": 0}
    if settings.second_process:
        threads = torch.get_num_threads()
        shapes = [[list(shape), kernel] for shape, kernel in CHOICES.chosen.items() if shape[-1] == threads]
        done = _second_process(settings, work_dir, shapes)
        for c in compiles:
            c.second_process_s = done["compile_s"][str(c.batch)]
        second = {key: done[key] for key in second}
    for c in compiles:
        print(f"batch {c.batch:>2}: trace {c.traced_s:.1f} s, compile {c.first_process_s:.1f} s in the first "
              f"process, " + ("not run again" if c.second_process_s is None else
                              f"{c.second_process_s:.1f} s in a second one"), flush=True)
    command = " ".join(["python -m bench.experiments fused_step", *non_default_flags(settings)])
    return FusedStep(settings.model, settings.prompt_tokens, settings.steps, settings.rounds,
                     torch.get_num_threads(), dict(COMPILE_OPTIONS), graphs, breaks, str(cache), cache_mb, second,
                     compiles, rows, command, environment(torch.device("cpu")))


def plot(result: FusedStep):
    fig, (steps, compiles) = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = [f"batch {r.batch}" for r in result.rows]
    grouped_bars(steps, labels, {name: [r.ms_per_step[name] for r in result.rows] for name in SIDES})
    steps.set_ylabel("ms per decode step (median, min-max)")
    grouped_bars(compiles, labels, {"trace": [c.traced_s for c in result.compiles],
                                    "compile, first process": [c.first_process_s for c in result.compiles],
                                    "compile, second process": [c.second_process_s for c in result.compiles]})
    compiles.set_ylabel("seconds, once per row count")
    return finish(fig, (steps, compiles), f"{result.model}: the fused step against the traced step", grid="y",
                  legend=True)


def section(res: FusedStep, page: Page) -> None:
    page.add(f"`{res.model}` with random weights, {res.prompt_tokens}-token prompts, {res.steps} greedy steps per "
             f"side per round, {res.rounds} interleaved rounds, {res.threads} thread(s). Fused: the traced step "
             f"compiled by Inductor ({', '.join(f'{k}={v}' for k, v in res.compile_options.items())}) with today's "
             f"packed products fixed in its graph; {res.graphs} graph(s) per row count"
             + (f", graph breaks: {'; '.join(res.graph_breaks)}" if res.graph_breaks else ", no graph break")
             + ". Each side's fixed path, all threads.\n")
    page.table(["batch", "host read GB/s", "matmul GFLOP/s", "load average", "traced ms/step", "fused ms/step",
                "traced tokens/s", "fused tokens/s", "fused speed-up (paired)", "logits max abs diff",
                "same tokens"],
               [[r.batch, f"{r.host_rates.read_gb_per_s:.1f}", f"{r.host_rates.matmul_gflop_per_s:.0f}",
                 f"{min(r.load_average):.2f}-{max(r.load_average):.2f}", spread(r.ms_per_step["traced"], 2),
                 spread(r.ms_per_step["fused"], 2), spread(r.tokens_per_s["traced"]),
                 spread(r.tokens_per_s["fused"]), f"{r.fused_speedup:.2f}x", f"{r.max_abs_diff:.1e}",
                 r.identical_tokens] for r in res.rows])
    page.add(f"One-time costs per row count, seconds; the Inductor cache was {res.cache_folder} "
             f"({res.cache_mb:.0f} MB after the first process), empty when the first process began; in the second "
             f"process Inductor's FX graph cache hit {res.second_process_cache['cache_hits']} graph(s), missed "
             f"{res.second_process_cache['cache_misses']} and was bypassed for "
             f"{res.second_process_cache['cache_bypasses']} (a hit skips the lowering, code generation and C++ "
             f"compile; Dynamo's capture, AOTAutograd and the freezing passes run in every process):\n")
    page.table(["batch", "trace", "compile, first process", "compile, second process"],
               [[c.batch, f"{c.traced_s:.1f}", f"{c.first_process_s:.1f}",
                 "not run" if c.second_process_s is None else f"{c.second_process_s:.1f}"] for c in res.compiles])


EXPERIMENT = Experiment(
    name="fused_step", title="A fused fp32 decode step (Inductor) against the traced step", about=__doc__,
    settings=Settings, quick=Settings(batch_sizes=[1, 4], steps=16, rounds=3), full=Settings(), result=FusedStep,
    measure=measure, plot=plot, section=section)
