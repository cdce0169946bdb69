"""Where a training run's time goes: data, forward, backward, optimizer, evaluation, other.

    python -m bench.experiments phase_profile            # tiny preset, batch 8, block 256, 30 steps, eval every 10

Runs train.py's single-device step with the device synchronised at every phase boundary (which
costs a little on CUDA and nothing on CPU), evaluating on --eval-batches validation batches every
--eval-interval steps as train.py does.  "other" is the wall time outside the named phases (the
loop, reading the loss).  Then a few more steps run under torch.profiler: its Chrome trace is
written to the experiment's work folder (open it in chrome://tracing or https://ui.perfetto.dev)
and its ten most expensive operators go into the result.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench.experiment import Experiment, TrainingSettings
from bench.plots import finish, plt
from bench.report_page import Page, num, timed_as
from data.loader import WindowSampler, eval_batches
from data.token_files import load_split
from model.config import preset
from training.evaluate import evaluate_loss
from model.gpt import GPT
from runtime.cli import option
from runtime.device import choose_device, precision_policy
from runtime.timing import Environment, environment
from training.metrics import PHASES, PhaseClock
from training.step import TrainStep


@dataclass
class Settings(TrainingSettings):
    batch_size: int = option(8, "sequences per step", min=1)
    block_size: int | None = option(None, "tokens per sequence (default: the model's "
                                          "context)", min=1)
    steps: int = option(30, "timed optimizer steps", min=1)
    eval_interval: int = option(10, "steps between evaluations", min=1)
    eval_batches: int = option(4, "validation batches per evaluation", min=1)
    profile_steps: int = option(3, "steps recorded by torch.profiler", min=1)


@dataclass
class Operator:
    op: str
    calls: int
    self_cpu_ms: float
    self_device_ms: float


@dataclass
class Profiler:
    steps: int
    trace: str  # the Chrome trace file (not kept with the results: it is large)
    top_ops: list[Operator]


@dataclass
class PhaseProfile:
    model: str
    batch_size: int
    block_size: int
    steps: int
    eval_interval: int
    eval_batches: int
    total_s: float
    phase_s: dict[str, float]
    phase_share: dict[str, float]
    step_s: float
    profiler: Profiler
    environment: Environment


def measure(settings: Settings, work_dir: Path) -> PhaseProfile:
    device = choose_device(settings.device)
    precision = precision_policy(device)
    config = preset(settings.model)
    block = settings.block_size or config.block_size
    torch.manual_seed(0)
    model = GPT(config).to(device)
    step = TrainStep.single_device(model, device, precision)
    sampler = WindowSampler(load_split(settings.dataset, "train"), block, settings.batch_size)
    val_tokens = load_split(settings.dataset, "validation")
    step(sampler.next_batch)  # warm-up, untimed

    clock = PhaseClock(device)
    start = time.perf_counter()
    for i in range(1, settings.steps + 1):
        step(sampler.next_batch, clock=clock)
        if i % settings.eval_interval == 0:
            with clock("evaluation"):
                evaluate_loss(model, eval_batches(val_tokens, block, settings.batch_size, settings.eval_batches),
                              device, precision.autocast)
    total = time.perf_counter() - start
    seconds = {phase: clock.seconds.get(phase, 0.0) for phase in PHASES}
    seconds["other"] += max(0.0, total - sum(seconds.values()))

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=False) as prof:
        for _ in range(settings.profile_steps):
            step(sampler.next_batch)
    trace = work_dir / "phase_profile.trace.json"
    work_dir.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace))
    sort_key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    top = sorted(prof.key_averages(), key=lambda e: getattr(e, sort_key), reverse=True)
    top_ops = [Operator(e.key, e.count, e.self_cpu_time_total / 1e3, e.self_device_time_total / 1e3) for e in top[:10]]
    return PhaseProfile(settings.model, settings.batch_size, block, settings.steps, settings.eval_interval,
                        settings.eval_batches, total, seconds, {k: v / total for k, v in seconds.items()},
                        (total - seconds["evaluation"]) / settings.steps,
                        Profiler(settings.profile_steps, str(trace), top_ops), environment(device))


def plot(result: PhaseProfile):
    # Bars, not a pie: phases of a fraction of a percent would print their labels on top of each other.
    phases = sorted(result.phase_s.items(), key=lambda kv: kv[1], reverse=True)
    fig, ax = plt.subplots(figsize=(6.5, 0.45 * len(phases) + 1.3))
    ax.barh([name for name, _ in phases], [seconds for _, seconds in phases], color="tab:blue")
    for row, (_, seconds) in enumerate(phases):
        ax.annotate(f" {seconds / result.total_s:.1%}", (seconds, row), va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("seconds in the run")
    ax.margins(x=0.15)
    return finish(fig, (ax,), f"{result.model}: {result.steps} steps of batch {result.batch_size} x "
                              f"{result.block_size}, eval every {result.eval_interval}", grid="x")


def section(res: PhaseProfile, page: Page) -> None:
    page.add(f"`{res.model}`, {res.steps} steps of {res.batch_size} x {res.block_size}, validation on "
             f"{res.eval_batches} batches every {res.eval_interval} steps; {res.step_s * 1e3:.0f} ms per "
             f"training step.\n")
    page.add(timed_as("train.py's single-device step, synchronised at every phase boundary, in this one process",
                      "not overlapped: one untimed warm-up step in this process"))
    page.table(["phase", "seconds", "share"], [[k, num(v, 3), f"{res.phase_share[k]:.1%}"]
                                               for k, v in res.phase_s.items()])
    prof = res.profiler
    page.add(f"torch.profiler, {prof.steps} steps: the trace is `{prof.trace}` (not kept with the results; open "
             f"it in https://ui.perfetto.dev). Most expensive operators:\n")
    page.table(["operator", "calls", "self CPU ms", "self device ms"],
               [[f"`{o.op}`", o.calls, num(o.self_cpu_ms), num(o.self_device_ms)] for o in prof.top_ops])


EXPERIMENT = Experiment(
    name="phase_profile", title="Phase profile", about=__doc__, settings=Settings,
    quick=Settings(block_size=128, steps=20), full=Settings(steps=100, eval_interval=25),
    result=PhaseProfile, measure=measure, plot=plot, section=section)
