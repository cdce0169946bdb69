"""A one-off generate() call as `sample.py` makes it: the default decode (`auto`) against eager steps (`dynamic`),
each call in a fresh process, so that every one-time cost (a trace of the decode step, its first runs) is paid
inside the call timed.

    python -m bench.experiments one_off_decode      # tiny and GPT-2 124M (random weights), 32 and 200 new tokens

Each process (bench/workloads/generate_once.py) builds the preset with random weights (seeded), packs its linear
layers as sample.py does, and times one greedy call (end-of-text does not stop it) on a seeded random prompt: the whole call, and its first new token.
The two paths run in turns within every round, in an order reversed every other round, so that a machine whose
load drifts weighs on both alike; each figure is the median over the rounds, and the 1-minute load average is
recorded before every round.  The tokens of the two paths are compared (greedy: they must be the same).

What a process measures of its trace is kept for the next one (decode/kept_ratios.py: the trace's cost and gain;
model/kernel_choice.py: the kernel per product shape), so the calls of one run get files of their own, empty at the
start: the first round is a host on which nothing was kept yet, the later rounds one on which sample.py has run
before.  `--no-kernel-choices` keeps only the trace timings (each process times its kernels itself, as before the
kernel choices were kept).
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiment import Experiment, ExperimentError, ExperimentSettings
from bench.plots import finish, grouped_bars, plt
from bench.report_page import Page, decode_path, num, spread
from bench.processes import run_command
from decode.kept_ratios import TIMINGS_ENV
from model.kernel_choice import CHOICES_ENV
from model.config import PRESETS
from runtime.cli import non_default_flags, option
from runtime.kept_file import OFF
from runtime.timing import Environment, Spread, environment, paired_ratio

PATHS = ("auto", "dynamic")

@dataclass
class Settings(ExperimentSettings):
    models: list[str] = option(["tiny", "gpt2"], "model presets (random weights)", choices=tuple(PRESETS))
    new_tokens: list[int] = option([32, 200], "tokens per call", min=1)
    prompt_tokens: int = option(16, "prompt length", min=1)
    rounds: int = option(5, "fresh processes per path, model and length", min=1)
    kernel_choices: bool = option(True, "keep the kernel chosen per product shape between the calls' processes "
                                        "(GPT2_KERNEL_CHOICES); --no-kernel-choices: each process times its own")
    threads: int | None = option(None, "torch threads in each process (default: torch's own); on a machine "
                                       "others load, 1 keeps a step from waiting on a descheduled thread", min=1)


@dataclass
class Row:
    model: str
    new_tokens: int
    decode: str
    call_s: Spread  # the whole generate() call, one-time costs included
    calls_s: list[float]  # each round's, in order
    first_token_s: Spread
    tokens_per_s: Spread  # new tokens / the whole call


@dataclass
class Comparison:
    model: str
    new_tokens: int
    # Median over rounds of the dynamic call's time / the auto call's in the same round: above 1, the default is
    # faster; each round compared with its own partner, which cancels load that changes between rounds.
    auto_speedup: float
    identical_tokens: bool


@dataclass
class OneOffDecode:
    prompt_tokens: int
    rounds: int
    threads: int  # torch threads in each call's process
    rows: list[Row]
    comparisons: list[Comparison]
    load_average_1m: Spread  # before each round
    command: str
    environment: Environment


def one_call(model: str, decode: str, new_tokens: int, settings: Settings, kept: dict[str, str]) -> dict:
    done = run_command([sys.executable, "-m", "bench.workloads.generate_once", model, decode, str(new_tokens),
                        str(settings.prompt_tokens), str(settings.threads or 0)], env=kept)
    if not done.ok:
        raise ExperimentError(f"the {decode} call on {model} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(settings: Settings, work_dir: Path) -> OneOffDecode:
    cases = [(model, n) for model in settings.models for n in settings.new_tokens]
    calls: dict[tuple, list[dict]] = {(*case, path): [] for case in cases for path in PATHS}
    loads = []
    work_dir.mkdir(parents=True, exist_ok=True)
    kept = {TIMINGS_ENV: str(work_dir / "trace_timings.json"),
            CHOICES_ENV: str(work_dir / "kernel_choices.json") if settings.kernel_choices else OFF}
    for name in ("trace_timings.json", "kernel_choices.json"):
        (work_dir / name).unlink(missing_ok=True)  # this experiment's own files from its last run
    for round_ in range(settings.rounds):
        loads.append(os.getloadavg()[0])
        for case in cases:
            for path in PATHS if round_ % 2 == 0 else reversed(PATHS):
                call = one_call(case[0], path, case[1], settings, kept)
                calls[(*case, path)].append(call)
                print(f"round {round_ + 1}/{settings.rounds}: {case[0]} {case[1]} tokens {path:8} "
                      f"{call['call_s'] * 1e3:8.1f} ms", flush=True)
    seconds = {key: [c["call_s"] for c in done] for key, done in calls.items()}
    rows = [Row(model, n, path, Spread.of(seconds[(model, n, path)]), seconds[(model, n, path)],
                Spread.of([c["first_token_s"] for c in done]), Spread.of([n / c["call_s"] for c in done]))
            for (model, n, path), done in calls.items()]
    comparisons = [Comparison(model, n, paired_ratio(seconds[(model, n, "dynamic")], seconds[(model, n, "auto")]),
                              all(a["tokens"] == d["tokens"] for a, d in zip(calls[(model, n, "auto")],
                                                                             calls[(model, n, "dynamic")])))
                   for model, n in cases]
    command = " ".join(["python -m bench.experiments one_off_decode", *non_default_flags(settings)])
    threads = next(iter(calls.values()))[0]["threads"]
    return OneOffDecode(settings.prompt_tokens, settings.rounds, threads, rows, comparisons, Spread.of(loads), command,
                        environment(torch.device("cpu")))


def plot(result: OneOffDecode):
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    calls = {(r.model, r.new_tokens, r.decode): r.call_s for r in result.rows}
    grouped_bars(ax, [f"{c.model}\n{c.new_tokens} tokens" for c in result.comparisons],
                 {path: [calls[c.model, c.new_tokens, path] for c in result.comparisons] for path in PATHS}, scale=1e3)
    ax.set_yscale("log")
    ax.set_ylabel("ms per one-off call (median, min-max)")
    return finish(fig, (ax,), "one generate() call per fresh process", grid="y", legend=True)


def section(res: OneOffDecode, page: Page) -> None:
    page.add(f"One greedy call per fresh process, {res.prompt_tokens}-token prompt, median of {res.rounds} rounds "
             f"(load average {spread(res.load_average_1m, 2)}), {res.threads} torch thread(s); the call includes every one-time "
             f"cost.\n")
    page.add("**Warm-ups:** none: each call is its fresh process's first, and the processes run one at a time. The "
             "**path timed** column says which decode path each row ran.\n")
    page.table(["model", "new tokens", "path timed", "call ms", "first token ms", "tokens/s over the call"],
               [[r.model, r.new_tokens, decode_path(r.decode), spread(r.call_s, 1, 1e3),
                 spread(r.first_token_s, 1, 1e3),
                 num(r.tokens_per_s.median)] for r in res.rows])
    page.table(["model", "new tokens", "auto's speed-up over dynamic (paired)", "same tokens"],
               [[c.model, c.new_tokens, f"{c.auto_speedup:.2f}x", c.identical_tokens] for c in res.comparisons])


EXPERIMENT = Experiment(
    name="one_off_decode", title="A one-off call: the default decode against eager steps", about=__doc__,
    settings=Settings, quick=Settings(rounds=3), full=Settings(rounds=7), result=OneOffDecode, measure=measure,
    plot=plot, section=section)
