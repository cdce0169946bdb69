"""Training throughput of train.py's step, and of nanoGPT's model and loop beside it in the same process.

    python bench/train_speed.py --nanogpt /path/to/nanoGPT      # nanoGPT's CPU config: 6 layers, 384 wide,
                                                                # 6 heads, block 256, batch 8, vocabulary 50304
    python bench/train_speed.py --model gpt2 --batch-size 1 --block-size 1024 --nanogpt /path/to/nanoGPT

Ours is `training.step.TrainStep` (what train.py, the pruning fine-tunes and the other benchmarks run).
nanoGPT's side is its own `model.py` (read from the checkout given with --nanogpt, never copied here) with
its `configure_optimizers` and the body of its train.py loop: forward under the same autocast, backward,
clip to 1.0, step, zero the gradients.  Both draw the same batches and are timed in interleaved repeats
(the order alternates), so machine noise hits both alike; the ratio is the median of per-repeat ratios.
"""
from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.timing import environment, summary
from data.loader import WindowSampler
from data.shards import load_split
from model.config import PRESETS, preset
from model.gpt import GPT
from runtime.cli import parse_config
from runtime.device import choose_device, precision_policy, synchronize
from runtime.errors import UserError
from training.step import TrainStep


class SpeedError(UserError):
    pass


@dataclass
class TrainSpeedConfig:
    model: str = field(default="small-cpu", metadata={"help": "model preset", "choices": tuple(PRESETS)})
    batch_size: int = field(default=8, metadata={"help": "sequences per step"})
    block_size: int = field(default=256, metadata={"help": "tokens per sequence"})
    steps: int = field(default=3, metadata={"help": "optimizer steps per timed repeat"})
    repeats: int = field(default=5, metadata={"help": "timed repeats of each implementation (interleaved)"})
    nanogpt: str | None = field(default=None, metadata={"help": "a karpathy/nanoGPT checkout to measure beside "
                                                                 "ours (its model.py)"})
    compile: bool = field(default=False, metadata={"help": "torch.compile both models"})
    device: str = field(default="auto", metadata={"help": "auto, cpu, cuda, ..."})
    out: str = field(default="bench/results/train_speed.json", metadata={"help": "result file"})

    def __post_init__(self):
        for name in ("batch_size", "block_size", "steps", "repeats"):
            if getattr(self, name) < 1:
                raise SpeedError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.nanogpt is not None and not (Path(self.nanogpt) / "model.py").is_file():
            raise SpeedError(f"--nanogpt {self.nanogpt} has no model.py; give the path of a karpathy/nanoGPT checkout")


def nanogpt_step(checkout: str, cfg: TrainSpeedConfig, device: torch.device, precision):
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


def our_step(cfg: TrainSpeedConfig, device: torch.device, precision):
    torch.manual_seed(0)
    model = GPT(preset(cfg.model, block_size=max(cfg.block_size, preset(cfg.model).block_size))).to(device)
    train_step = TrainStep.single_device(torch.compile(model) if cfg.compile else model, device, precision, lr=6e-4)
    return lambda next_batch: train_step(next_batch)


def measure(cfg: TrainSpeedConfig) -> dict:
    device = choose_device(cfg.device)
    precision = precision_policy(device)
    tokens = load_split("builtin", "train")
    steps = {"ours": our_step(cfg, device, precision)}
    if cfg.nanogpt:
        steps["nanogpt"] = nanogpt_step(cfg.nanogpt, cfg, device, precision)
    else:
        print("no --nanogpt checkout given: measuring the project's step alone", file=sys.stderr)
    samplers = {name: WindowSampler(tokens, cfg.block_size, cfg.batch_size, seed=0) for name in steps}
    seconds = {name: [] for name in steps}
    for repeat in range(cfg.repeats + 1):  # the first round warms up (and compiles) untimed
        order = list(steps) if repeat % 2 == 0 else list(reversed(steps))
        for name in order:
            synchronize(device)
            start = time.perf_counter()
            for _ in range(cfg.steps):
                steps[name](samplers[name].next_batch)
            synchronize(device)
            if repeat:
                seconds[name].append(time.perf_counter() - start)
    per_repeat = cfg.steps * cfg.batch_size * cfg.block_size
    result = {"model": cfg.model, "batch_size": cfg.batch_size, "block_size": cfg.block_size, "steps": cfg.steps,
              "compile": cfg.compile, "precision": str(precision.autocast_dtype or torch.float32),
              "tokens_per_s": {name: summary([per_repeat / s for s in times]) for name, times in seconds.items()},
              "environment": environment(device)}
    if "nanogpt" in seconds:
        result["ratio_ours_over_nanogpt"] = statistics.median(
            n / o for o, n in zip(seconds["ours"], seconds["nanogpt"]))
        result["nanogpt_checkout"] = str(cfg.nanogpt)
    return result


def main(argv=None) -> None:
    try:
        cfg = parse_config(TrainSpeedConfig, __doc__, argv)
        result = measure(cfg)
    except UserError as e:
        sys.exit(f"error: {e}")
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    Path(cfg.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
