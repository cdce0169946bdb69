"""Training throughput of the default training path (the exact step `train.py` runs), medians of repeats.

    python bench/train_speed.py                      # nanoGPT's CPU reference config: 6 layers, 384 wide,
                                                     # 6 heads, block 256, batch 8, vocabulary padded to 50304
    python bench/train_speed.py --compile            # the same with torch.compile
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.timing import environment, summary, time_repeats
from data.loader import WindowSampler
from data.shards import load_split
from model.config import preset
from model.gpt import GPT
from model.optim import build_optimizer
from runtime.device import choose_device, precision_policy


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small-cpu")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=Path("bench/results/train_speed.json"))
    args = parser.parse_args(argv)

    device = choose_device(args.device)
    precision = precision_policy(device)
    torch.manual_seed(0)
    model = GPT(preset(args.model, block_size=max(args.block_size, preset(args.model).block_size))).to(device)
    step_model = torch.compile(model) if args.compile else model
    optimizer = build_optimizer(model, 6e-4, 0.1, device_type=device.type)
    sampler = WindowSampler(load_split("builtin", "train"), args.block_size, args.batch_size)

    def steps():
        for _ in range(args.steps):
            x, y = (t.to(device) for t in sampler.next_batch())
            with precision.autocast():
                _, loss = step_model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    times = time_repeats(steps, args.repeats, warmup=1, device=device)
    tokens = args.steps * args.batch_size * args.block_size
    result = {"model": args.model, "batch_size": args.batch_size, "block_size": args.block_size,
              "padded_vocab": model.config.padded_vocab_size, "compile": args.compile,
              "tokens_per_s": summary([tokens / t for t in times]), "environment": environment(device)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
