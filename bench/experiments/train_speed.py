"""Training throughput of train.py's step, and of nanoGPT's model and loop beside it in the same process.

    python -m bench.experiments train_speed --nanogpt /path/to/nanoGPT   # nanoGPT's CPU config: 6 layers, 384
                                                                         # wide, 6 heads, block 256, batch 8
    python -m bench.experiments train_speed --model gpt2 --batch-size 1 --block-size 1024 --nanogpt /path/to/nanoGPT

Ours is `training.step.TrainStep` (what train.py, the pruning fine-tunes and the other benchmarks run).
nanoGPT's side is its own `model.py` (read from the checkout given with --nanogpt, never copied here) with
its `configure_optimizers` and the body of its train.py loop: forward under the same autocast, backward,
clip to 1.0, step, zero the gradients.  Both draw the same batches and are timed in interleaved repeats
(the order alternates), so machine noise hits both alike; the ratio is the median of per-repeat ratios.
Without --nanogpt the project's step is measured alone.
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.experiment import Experiment, SettingsError, at_least
from bench.record import plt
from bench.report_page import Page, spread
from data.loader import WindowSampler
from data.shards import load_split
from model.config import PRESETS, preset
from model.gpt import GPT
from runtime.device import choose_device, precision_policy
from runtime.timing import Environment, Spread, environment, paired_ratio, time_interleaved
from training.step import TrainStep


@dataclass
class Settings:
    model: str = field(default="small-cpu", metadata={"help": "model preset", "choices": tuple(PRESETS)})
    batch_size: int = field(default=8, metadata={"help": "sequences per step"})
    block_size: int = field(default=256, metadata={"help": "tokens per sequence"})
    steps: int = field(default=3, metadata={"help": "optimizer steps per timed repeat"})
    repeats: int = field(default=5, metadata={"help": "timed repeats of each implementation (interleaved)"})
    nanogpt: str | None = field(default=None, metadata={"help": "a karpathy/nanoGPT checkout to measure beside "
                                                                 "ours (its model.py)"})
    compile: bool = field(default=False, metadata={"help": "torch.compile both models"})
    device: str = field(default="auto", metadata={"help": "auto, cpu, cuda, ..."})

    def __post_init__(self):
        at_least(self, 1, "batch_size", "block_size", "steps", "repeats")
        if self.nanogpt is not None and not (Path(self.nanogpt) / "model.py").is_file():
            raise SettingsError(f"--nanogpt {self.nanogpt} has no model.py; give the path of a karpathy/nanoGPT "
                                f"checkout")


@dataclass
class TrainSpeed:
    model: str
    batch_size: int
    block_size: int
    steps: int
    compile: bool
    precision: str
    tokens_per_s: dict[str, Spread]  # "ours", and "nanogpt" when measured
    environment: Environment
    ratio_ours_over_nanogpt: float | None = None
    nanogpt_checkout: str | None = None


def nanogpt_step(checkout: str, cfg: Settings, device: torch.device, precision):
    """nanoGPT's model, optimizer and loop body, from its own source."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", Path(checkout) / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ours = preset(cfg.model)
    torch.manual_seed(0)
    model = module.GPT(module.GPTConfig(n_layer=ours.n_layer, n_head=ours.n_head, n_embd=ours.n_embd,
                                        block_size=max(cfg.block_size, ours.block_size), vocab_size=50304,
                                        dropout=0.0, bias=True)).to(device)
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device.type)
    runner = torch.compile(model) if cfg.compile else model

    def step(next_batch):
        x, y = (t.contiguous().to(device) for t in next_batch())  # its loss views the targets
        with precision.autocast():
            _, loss = runner(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def our_step(cfg: Settings, device: torch.device, precision):
    torch.manual_seed(0)
    model = GPT(preset(cfg.model, block_size=max(cfg.block_size, preset(cfg.model).block_size))).to(device)
    train_step = TrainStep.single_device(torch.compile(model) if cfg.compile else model, device, precision, lr=6e-4)
    return lambda next_batch: train_step(next_batch)


def measure(settings: Settings, work_dir: Path) -> TrainSpeed:
    device = choose_device(settings.device)
    precision = precision_policy(device)
    tokens = load_split("builtin", "train")
    steps = {"ours": our_step(settings, device, precision)}
    if settings.nanogpt:
        steps["nanogpt"] = nanogpt_step(settings.nanogpt, settings, device, precision)
    else:
        print("no --nanogpt checkout given: measuring the project's step alone", file=sys.stderr)
    samplers = {name: WindowSampler(tokens, settings.block_size, settings.batch_size, seed=0) for name in steps}
    calls = {name: lambda step=step, sampler=samplers[name]: [step(sampler.next_batch) for _ in range(settings.steps)]
             for name, step in steps.items()}
    # The first round warms up (and compiles) untimed.
    seconds = time_interleaved(calls, settings.repeats, warmup=1, device=device, alternate=True)
    per_repeat = settings.steps * settings.batch_size * settings.block_size
    result = TrainSpeed(settings.model, settings.batch_size, settings.block_size, settings.steps, settings.compile,
                        str(precision.autocast_dtype or torch.float32),
                        {name: Spread.of([per_repeat / s for s in times]) for name, times in seconds.items()},
                        environment(device))
    if "nanogpt" in seconds:
        result.ratio_ours_over_nanogpt = paired_ratio(seconds["nanogpt"], seconds["ours"])
        result.nanogpt_checkout = settings.nanogpt
    return result


def plot(result: TrainSpeed):
    fig, ax = plt.subplots(figsize=(5, 3.5))
    names = list(result.tokens_per_s)
    medians = [result.tokens_per_s[n].median for n in names]
    ranges = [[m - result.tokens_per_s[n].min for n, m in zip(names, medians)],
              [result.tokens_per_s[n].max - m for n, m in zip(names, medians)]]
    ax.bar(names, medians, yerr=ranges, capsize=6, color=["tab:blue", "tab:grey"][:len(names)])
    ax.set_ylabel("training tokens / s (min-max)")
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(f"{result.model}, batch {result.batch_size} x block {result.block_size}")
    return fig


def section(res: TrainSpeed, page: Page) -> None:
    page.add(f"`{res.model}`, batch {res.batch_size} x block {res.block_size}, {res.steps} optimizer step(s) per "
             f"timed repeat, {res.precision}{', torch.compile' if res.compile else ''}"
             + ("; the implementations timed in alternating turns, on the same batches.\n"
                if len(res.tokens_per_s) > 1 else ".\n"))
    page.table(["training step", "tokens/s (min-max)"],
               [[name, spread(s, 0)] for name, s in res.tokens_per_s.items()])
    if res.ratio_ours_over_nanogpt is not None:
        page.add(f"**train.py's step: {res.ratio_ours_over_nanogpt:.2f}x nanoGPT's** (median of per-repeat ratios; "
                 f"nanoGPT's own `model.py` and loop from `{res.nanogpt_checkout}`).\n")
    else:
        page.add("No nanoGPT checkout was given (`--nanogpt`): the project's step alone.\n")


EXPERIMENT = Experiment(
    name="train_speed", title="Training step against nanoGPT", about=__doc__, settings=Settings,
    quick=Settings(steps=1, repeats=3), full=Settings(),
    result=TrainSpeed, measure=measure, plot=plot, section=section,
    # nanoGPT's bench.py configuration: GPT-2 124M, batch 12 x 1024, bf16 autocast, torch.compile.
    gpu=Settings(model="gpt2", batch_size=12, block_size=1024, steps=10, repeats=5, compile=True))
