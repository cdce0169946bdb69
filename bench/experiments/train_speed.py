"""Training throughput of train.py's step, and of nanoGPT's model and loop beside it in the same process.

    python -m bench.experiments train_speed --nanogpt /path/to/nanoGPT   # two CPU shapes: nanoGPT's CPU config
                                                                         # (6 layers, 384 wide, batch 8 x 256) and
                                                                         # GPT-2 124M at batch 1 x 1024
    python -m bench.experiments train_speed --shapes gpt2:12x1024 --compile --nanogpt /path/to/nanoGPT  # a GPU

Ours is `training.step.TrainStep` (what train.py, the pruning fine-tunes and the other benchmarks run).
nanoGPT's side is its own `model.py` (read from the checkout given with --nanogpt, never copied here) with
its `configure_optimizers` and the body of its train.py loop: forward under the same autocast, backward,
clip to 1.0, step, zero the gradients.  For each shape both draw the same batches and are timed in
interleaved repeats (the order alternates), so machine noise hits both alike; the ratio is the median of
per-repeat ratios.  Without --nanogpt the project's step is measured alone.
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.experiment import Experiment, ExperimentSettings, SettingsError
from bench.plots import bars, finish, plt
from bench.report_page import Page, spread, timed_as
from data.loader import WindowSampler
from data.token_files import load_split
from model.config import PRESETS, preset
from model.gpt import GPT
from runtime.cli import option
from runtime.device import choose_device, precision_policy
from runtime.timing import Environment, Spread, environment, paired_ratio, time_interleaved
from training.step import TrainStep


@dataclass(frozen=True)
class Shape:
    model: str  # preset
    batch_size: int
    block_size: int

    @classmethod
    def parse(cls, text: str) -> Shape:
        try:
            model, sizes = text.split(":")
            batch, block = (int(n) for n in sizes.split("x"))
        except ValueError:
            raise SettingsError(f"--shapes {text!r} is not PRESET:BATCHxBLOCK (e.g. gpt2:1x1024)") from None
        if model not in PRESETS:
            raise SettingsError(f"--shapes {text!r}: no preset {model!r}; choose from {', '.join(PRESETS)}")
        if batch < 1 or block < 1:
            raise SettingsError(f"--shapes {text!r}: batch and block must be at least 1")
        return cls(model, batch, block)


@dataclass
class Settings(ExperimentSettings):
    shapes: list[str] = field(default_factory=lambda: ["small-cpu:8x256", "gpt2:1x1024"], metadata={
        "help": "model preset and batch x block of each configuration timed, as PRESET:BATCHxBLOCK"})
    steps: int = option(3, "optimizer steps per timed repeat", min=1)
    repeats: int = option(5, "timed repeats of each implementation (interleaved)", min=1)
    nanogpt: str | None = option(None, "a karpathy/nanoGPT checkout to measure beside "
                                       "ours (its model.py)")
    compile: bool = option(False, "torch.compile both models")
    device: str = option("auto", "auto, cpu, cuda, ...")

    def __post_init__(self):
        super().__post_init__()
        if not self.shapes:
            raise SettingsError("--shapes needs at least one PRESET:BATCHxBLOCK")
        for text in self.shapes:
            Shape.parse(text)
        if self.nanogpt is not None and not (Path(self.nanogpt) / "model.py").is_file():
            raise SettingsError(f"--nanogpt {self.nanogpt} has no model.py; give the path of a karpathy/nanoGPT "
                                f"checkout")


@dataclass
class ShapeSpeed:
    model: str
    batch_size: int
    block_size: int
    tokens_per_s: dict[str, Spread]  # "ours", and "nanogpt" when measured
    ratio_ours_over_nanogpt: float | None = None


@dataclass
class TrainSpeed:
    steps: int
    compile: bool
    precision: str
    shapes: list[ShapeSpeed]
    environment: Environment
    nanogpt_checkout: str | None = None


def nanogpt_step(checkout: str, shape: Shape, compile: bool, device: torch.device, precision):
    """nanoGPT's model, optimizer and loop body, from its own source."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", Path(checkout) / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ours = preset(shape.model)
    torch.manual_seed(0)
    model = module.GPT(module.GPTConfig(n_layer=ours.n_layer, n_head=ours.n_head, n_embd=ours.n_embd,
                                        block_size=max(shape.block_size, ours.block_size), vocab_size=50304,
                                        dropout=0.0, bias=True)).to(device)
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device.type)
    runner = torch.compile(model) if compile else model

    def step(next_batch):
        x, y = (t.contiguous().to(device) for t in next_batch())  # its loss views the targets
        with precision.autocast():
            _, loss = runner(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def our_step(shape: Shape, compile: bool, device: torch.device, precision):
    torch.manual_seed(0)
    model = GPT(preset(shape.model, block_size=max(shape.block_size, preset(shape.model).block_size))).to(device)
    train_step = TrainStep.single_device(torch.compile(model) if compile else model, device, precision, lr=6e-4)
    return lambda next_batch: train_step(next_batch)


def measure_shape(settings: Settings, shape: Shape, tokens, device: torch.device, precision) -> ShapeSpeed:
    steps = {"ours": our_step(shape, settings.compile, device, precision)}
    if settings.nanogpt:
        steps["nanogpt"] = nanogpt_step(settings.nanogpt, shape, settings.compile, device, precision)
    samplers = {name: WindowSampler(tokens, shape.block_size, shape.batch_size, seed=0) for name in steps}
    calls = {name: lambda step=step, sampler=samplers[name]: [step(sampler.next_batch) for _ in range(settings.steps)]
             for name, step in steps.items()}
    # The first round warms up (and compiles) untimed.
    seconds = time_interleaved(calls, settings.repeats, warmup=1, device=device, alternate=True,
                               progress=f"{shape.model} {shape.batch_size}x{shape.block_size}")
    per_repeat = settings.steps * shape.batch_size * shape.block_size
    result = ShapeSpeed(shape.model, shape.batch_size, shape.block_size,
                        {name: Spread.of([per_repeat / s for s in times]) for name, times in seconds.items()})
    if "nanogpt" in seconds:
        result.ratio_ours_over_nanogpt = paired_ratio(seconds["nanogpt"], seconds["ours"])
    print(f"{shape.model} {shape.batch_size}x{shape.block_size}: ours {result.tokens_per_s['ours'].median:,.0f} "
          f"tokens/s" + (f", nanoGPT {result.tokens_per_s['nanogpt'].median:,.0f}, ratio "
                         f"{result.ratio_ours_over_nanogpt:.2f}x" if "nanogpt" in seconds else ""))
    return result


def measure(settings: Settings, work_dir: Path) -> TrainSpeed:
    device = choose_device(settings.device)
    precision = precision_policy(device)
    tokens = load_split("builtin", "train")
    if not settings.nanogpt:
        print("no --nanogpt checkout given: measuring the project's step alone", file=sys.stderr)
    shapes = [measure_shape(settings, Shape.parse(text), tokens, device, precision) for text in settings.shapes]
    return TrainSpeed(settings.steps, settings.compile, str(precision.autocast_dtype or torch.float32), shapes,
                      environment(device), settings.nanogpt)


def plot(result: TrainSpeed):
    fig, axes = plt.subplots(1, len(result.shapes), figsize=(4 * len(result.shapes), 3.5), squeeze=False)
    for ax, shape in zip(axes[0], result.shapes):
        bars(ax, list(shape.tokens_per_s), list(shape.tokens_per_s.values()),
             color=["tab:blue", "tab:grey"][:len(shape.tokens_per_s)])
        ax.set_ylabel("training tokens / s (min-max)")
        ax.set_title(f"{shape.model}, batch {shape.batch_size} x block {shape.block_size}")
    return finish(fig, axes[0], grid="y")


def section(res: TrainSpeed, page: Page) -> None:
    compared = any(shape.ratio_ours_over_nanogpt is not None for shape in res.shapes)
    page.add(f"{res.steps} optimizer step(s) per timed repeat, {res.precision}"
             f"{', torch.compile' if res.compile else ''}"
             + ("; for each shape the implementations timed in alternating turns, on the same batches.\n"
                if compared else ".\n"))
    page.add(timed_as("`TrainStep`, train.py's step, and nanoGPT's loop, both in this one process",
                      "not overlapped: the first round, one side after the other, is untimed"))
    page.table(["shape", "train.py's step tokens/s (min-max)", "nanoGPT tokens/s (min-max)", "ours / nanoGPT"],
               [[f"`{s.model}`, batch {s.batch_size} x block {s.block_size}", spread(s.tokens_per_s["ours"], 0),
                 spread(s.tokens_per_s.get("nanogpt"), 0),
                 "n/a" if s.ratio_ours_over_nanogpt is None else f"**{s.ratio_ours_over_nanogpt:.2f}x**"]
                for s in res.shapes])
    if compared:
        page.add(f"Ratios are medians of per-repeat ratios; nanoGPT's own `model.py` and loop from "
                 f"`{res.nanogpt_checkout}`.\n")
    else:
        page.add("No nanoGPT checkout was given (`--nanogpt`): the project's step alone.\n")


EXPERIMENT = Experiment(
    name="train_speed", title="Training step against nanoGPT", about=__doc__, settings=Settings,
    quick=Settings(shapes=["small-cpu:8x256"], steps=1, repeats=3), full=Settings(),
    result=TrainSpeed, measure=measure, plot=plot, section=section,
    # nanoGPT's bench.py configuration: GPT-2 124M, batch 12 x 1024, bf16 autocast, torch.compile.
    gpu=Settings(shapes=["gpt2:12x1024"], steps=10, repeats=5, compile=True))
