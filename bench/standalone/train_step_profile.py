"""Where train.py's step spends a GPU's time beside nanoGPT's: timed in interleaved turns, then a few steps of each
under torch.profiler.

    python -m bench.standalone.train_step_profile --nanogpt PATH --compile     # a GPU: GPT-2 124M, 12 x 1024, bf16
    python -m bench.standalone.train_step_profile --nanogpt PATH --shape tiny:2x64 --steps 1 --repeats 1  # a check

With --loss-over-slice a fourth side times a proposed loss path: train.py's step on a model whose training loss is
the cross-entropy of the real vocabulary's slice of the logits, instead of writing -inf into the padding first (its
own compiled model).

The sides are nanoGPT's model and loop (bench/experiments/train_speed.py's, from the checkout given), the project's
TrainStep as train.py runs it (the loss and gradient norm checked on the device, the update launched before they
are read back), and the same step reading them back before launching the update (`read_before_update`, the order
before that change; both of ours share one compiled model, each with its own optimizer).  All draw the same batches
and are timed in interleaved turns whose order reverses every other round; ratios are medians of per-round ratios
against nanoGPT.  Then each side runs --profile-steps steps under torch.profiler (on a GPU its kernels alone, so the
profiler adds little host work): the kernels by total time (name, count, total), the device's busy time (the union
of its kernels' intervals) against the wall time per step, the longest idle gaps with the kernels either side (the
host's share), the optimizer's and clipping's kernels, and dynamo's graph breaks and compiled graphs.  On the CPU the
profiler's ops (nested) stand in for kernels.  Results: RESULTS_DIR/train_step_profile.json and .md.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from bench.experiments.train_speed import Shape, nanogpt_step
from bench.record import RESULTS_DIR, write_result
from bench.experiment import SettingsError
from data.loader import WindowSampler
from data.token_files import load_split
from model.config import preset
from model.gpt import GPT
from parallel import CommsMeter, DistContext, SingleDevice
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.device import choose_device, precision_policy, synchronize
from runtime.errors import UserError
from runtime.timing import Environment, Spread, environment, paired_ratio, time_interleaved
from training.optim import build_optimizer
from training.step import TrainStep

NANOGPT, OURS, OURS_READ_FIRST, OURS_SLICED = "nanogpt", "ours", "ours_read_before_update", "ours_loss_over_slice"
TOP_KERNELS = 15
TOP_GAPS = 5
OPTIMIZER_KERNEL = re.compile(r"adam|multi_tensor|foreach|norm_kernel|clip", re.IGNORECASE)


@dataclass
class TrainStepProfileConfig:
    nanogpt: Path = option(Path("nanogpt"), "a karpathy/nanoGPT checkout (its model.py)")
    shape: str = option("gpt2:12x1024", "model preset and batch x block, as PRESET:BATCHxBLOCK")
    compile: bool = option(False, "torch.compile every side's model")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    steps: int = option(10, "optimizer steps per timed turn", min=1)
    repeats: int = option(5, "timed rounds (after one untimed warm-up round)", min=1)
    profile_steps: int = option(3, "steps of each side under the profiler", min=1)
    loss_over_slice: bool = option(False, "also time train.py's step with the loss over the logits' real-vocabulary "
                                          "slice (no -inf written into the padding)")
    results_dir: Path = option(RESULTS_DIR, "where train_step_profile.json and .md go")

    def __post_init__(self):
        check_options(self, UserError)
        try:
            Shape.parse(self.shape)
        except SettingsError as e:  # train_speed's message, whose flag takes several shapes
            raise UserError(str(e).replace("--shapes", "--shape", 1)) from None
        if not (self.nanogpt / "model.py").is_file():
            raise UserError(f"--nanogpt {self.nanogpt} has no model.py; give the path of a karpathy/nanoGPT checkout")


@dataclass
class Kernel:
    name: str
    count: int
    total_ms: float


@dataclass
class Gap:
    ms: float
    after: str  # the kernel that ended before the device went idle
    before: str  # the kernel that started it again


@dataclass
class SideProfile:
    tokens_per_s: Spread
    over_nanogpt: float | None  # median of per-round ratios; None for nanoGPT itself
    fused_optimizer: bool
    wall_ms_per_step: float  # under the profiler
    busy_ms_per_step: float  # union of the kernels' intervals
    idle_share: float  # 1 - busy / wall
    kernels_per_step: float
    top_kernels: list[Kernel]
    optimizer_kernels: list[Kernel]
    longest_gaps: list[Gap]
    graph_breaks: int
    graph_break_reasons: list[str]
    compiled_graphs: int  # dynamo's unique graphs after this side's warm-up (all sides so far)


@dataclass
class TrainStepProfile:
    shape: str
    compile: bool
    precision: str
    steps: int
    profile_steps: int
    timeline: str  # "CUDA kernels" or "CPU ops (nested)"
    sides: dict[str, SideProfile]
    compiled_graphs_after_timing: int  # more than after the last warm-up: something recompiled while timed
    environment: Environment
    nanogpt_checkout: str


def our_steps(shape: Shape, compile: bool, device: torch.device, precision) -> dict[str, Callable]:
    """train.py's step, and the same step reading the loss and norm back before the update, on one model."""
    torch.manual_seed(0)
    model = GPT(preset(shape.model, block_size=max(shape.block_size, preset(shape.model).block_size))).to(device)
    runner = torch.compile(model) if compile else model
    ours = TrainStep.single_device(runner, device, precision, lr=6e-4)
    read_first = TrainStep(runner, build_optimizer(model, 6e-4, 0.1),
                           SingleDevice(runner, DistContext(device=device), CommsMeter()), device, precision,
                           read_before_update=True)
    return {OURS: ours, OURS_READ_FIRST: read_first}


class LossOverSlice(GPT):
    """The proposed loss path: the cross-entropy of the real vocabulary's slice of the logits, a strided view that
    a compiled graph can read in place, instead of writing -inf into the padding (an extra pass over the logits
    and, in backward, over their gradient, unless the compiler fuses it)."""

    def training_loss(self, padded, targets):
        logits = padded[..., :self.config.vocab_size]
        return logits, F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)


def sliced_loss_step(shape: Shape, compile: bool, device: torch.device, precision) -> TrainStep:
    torch.manual_seed(0)
    model = LossOverSlice(preset(shape.model, block_size=max(shape.block_size, preset(shape.model).block_size)))
    model = model.to(device)
    return TrainStep.single_device(torch.compile(model) if compile else model, device, precision, lr=6e-4)


def merged(intervals: list[tuple[float, float, str]]) -> list[tuple[float, float, str, str]]:
    """The intervals (start, end, name), sorted and merged: (start, end, first name, last name) each."""
    out: list[list] = []
    for start, end, name in sorted(intervals):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1][1], out[-1][3] = end, name
        else:
            out.append([start, end, name, name])
    return [tuple(m) for m in out]


def by_name(events) -> list[Kernel]:
    totals: dict[str, list] = {}
    for e in events:
        entry = totals.setdefault(e.name, [0, 0.0])
        entry[0] += 1
        entry[1] += e.time_range.elapsed_us() / 1e3
    return sorted((Kernel(name, count, total) for name, (count, total) in totals.items()),
                  key=lambda k: -k.total_ms)


def profiled(step: Callable, next_batch, steps: int, device: torch.device):
    """Wall seconds of `steps` steps, and the profiler's device-side events (CPU ops on the CPU)."""
    cuda = device.type == "cuda"
    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step(next_batch)
        synchronize(device)
        wall = time.perf_counter() - start
    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    return wall, [e for e in prof.events() if e.device_type == kind and e.time_range.elapsed_us() > 0]


def side_profile(wall: float, events, steps: int, seconds, nanogpt_seconds, tokens: int, fused: bool,
                 graph_breaks: int, graphs: int) -> SideProfile:
    spans = merged([(e.time_range.start, e.time_range.end, e.name) for e in events])
    busy_ms = sum(end - start for start, end, _, _ in spans) / 1e3
    gaps = sorted((Gap((nxt[0] - cur[1]) / 1e3, cur[3], nxt[2]) for cur, nxt in zip(spans, spans[1:])),
                  key=lambda g: -g.ms)[:TOP_GAPS]
    kernels = by_name(events)
    breaks = counters["graph_break"]
    return SideProfile(
        Spread.of([tokens / s for s in seconds]),
        None if nanogpt_seconds is None else paired_ratio(nanogpt_seconds, seconds), fused,
        wall * 1e3 / steps, busy_ms / steps, max(0.0, 1 - busy_ms / (wall * 1e3)), len(events) / steps,
        kernels[:TOP_KERNELS], [k for k in kernels if OPTIMIZER_KERNEL.search(k.name)], gaps,
        graph_breaks, [str(reason) for reason in breaks][:5], graphs)


def markdown(res: TrainStepProfile) -> str:
    names = list(res.sides)
    rows = [("tokens/s (median)", lambda s: f"{s.tokens_per_s.median:,.0f}"),
            ("over nanoGPT (median of rounds)", lambda s: "1" if s.over_nanogpt is None else f"{s.over_nanogpt:.3f}x"),
            ("wall ms / step (profiled)", lambda s: f"{s.wall_ms_per_step:.2f}"),
            ("device busy ms / step", lambda s: f"{s.busy_ms_per_step:.2f}"),
            ("device idle share", lambda s: f"{100 * s.idle_share:.1f}%"),
            (f"{'kernels' if res.timeline.startswith('CUDA') else 'ops'} / step", lambda s: f"{s.kernels_per_step:.0f}"),
            ("fused AdamW", lambda s: "yes" if s.fused_optimizer else "no"),
            ("optimizer + clipping ms / step",
             lambda s: f"{sum(k.total_ms for k in s.optimizer_kernels) / res.profile_steps:.2f}"),
            ("graph breaks", lambda s: str(s.graph_breaks)),
            ("longest idle gap ms", lambda s: f"{s.longest_gaps[0].ms:.2f}" if s.longest_gaps else "-")]
    lines = [f"# train step profile: {res.shape}, {res.precision}{', compiled' if res.compile else ''}, "
             f"{res.environment.device}", "",
             "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {label} | " + " | ".join(cell(res.sides[n]) for n in names) + " |" for label, cell in rows]
    for name, side in res.sides.items():
        lines += ["", f"## {name}: top {res.timeline} by total time over {res.profile_steps} steps", "",
                  "| ms | count | name |", "|---|---|---|"]
        lines += [f"| {k.total_ms:.2f} | {k.count} | `{k.name[:90]}` |" for k in side.top_kernels]
    return "\n".join(lines) + "\n"


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(TrainStepProfileConfig, __doc__, argv)
    shape = Shape.parse(cfg.shape)
    device = choose_device(cfg.device)
    precision = precision_policy(device)
    tokens = load_split("builtin", "train")
    counters.clear()
    steps = {NANOGPT: nanogpt_step(str(cfg.nanogpt), shape, cfg.compile, device, precision),
             **our_steps(shape, cfg.compile, device, precision)}
    if cfg.loss_over_slice:
        steps[OURS_SLICED] = sliced_loss_step(shape, cfg.compile, device, precision)
    # nanoGPT's configure_optimizers asks for the fused kernel on CUDA (and prints whether it got it).
    fused = {NANOGPT: device.type == "cuda",
             **{name: bool(steps[name].optimizer.defaults.get("fused")) for name in steps if name != NANOGPT}}
    samplers = {name: WindowSampler(tokens, shape.block_size, shape.batch_size, seed=0) for name in steps}
    breaks, graphs = {}, {}
    for name, step in steps.items():  # warm up (and compile) each side alone, to tell whose graph breaks are whose
        before = sum(counters["graph_break"].values())
        step(samplers[name].next_batch)
        synchronize(device)
        breaks[name], graphs[name] = sum(counters["graph_break"].values()) - before, counters["stats"]["unique_graphs"]
    calls = {name: lambda step=step, s=samplers[name]: [step(s.next_batch) for _ in range(cfg.steps)]
             for name, step in steps.items()}
    seconds = time_interleaved(calls, cfg.repeats, warmup=1, device=device, alternate=True,
                               progress=f"{cfg.shape} rounds")
    graphs_after_timing = counters["stats"]["unique_graphs"]
    per_turn = cfg.steps * shape.batch_size * shape.block_size
    sides = {}
    for name, step in steps.items():
        wall, events = profiled(step, samplers[name].next_batch, cfg.profile_steps, device)
        sides[name] = side_profile(wall, events, cfg.profile_steps, seconds[name],
                                   None if name == NANOGPT else seconds[NANOGPT], per_turn, fused[name], breaks[name],
                                   graphs[name])
    result = TrainStepProfile(cfg.shape, cfg.compile, str(precision.autocast_dtype or torch.float32), cfg.steps,
                              cfg.profile_steps, "CUDA kernels" if device.type == "cuda" else "CPU ops (nested)",
                              sides, graphs_after_timing, environment(device), str(cfg.nanogpt))
    for name, side in sides.items():
        print(f"{name}: {side.tokens_per_s.median:,.0f} tokens/s"
              + ("" if side.over_nanogpt is None else f" ({side.over_nanogpt:.3f}x nanoGPT)")
              + f"; busy {side.busy_ms_per_step:.2f} of {side.wall_ms_per_step:.2f} ms a step; "
                f"{side.graph_breaks} graph breaks")
    write_result(cfg.results_dir, "train_step_profile", result)
    (cfg.results_dir / "train_step_profile.md").write_text(markdown(result))


if __name__ == "__main__":
    main()
