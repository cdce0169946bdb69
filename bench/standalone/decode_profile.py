"""Where a CPU decoding step spends its time, and what each matrix product reaches: the evidence behind
model/packed_linear.py, written as one Markdown page.

    python bench/standalone/decode_profile.py   # GPT-2 124M, random weights -> bench/results/decode_profile.md

1. Each product of a GPT-2 step, on 1 and on 12 rows, through nn.Linear (PyTorch's default CPU path, MKL) and
   through PackedLinear (oneDNN, weight packed ahead; one row: a batched product over blocks of the weight's
   rows, one per thread): GB/s of weights read, with enough distinct copies of each
   matrix (about 200 MB) that they stream from memory as in a real step, not from cache.
2. torch.profiler over decode steps at batch 1 and 12 (32 cached positions): eager with nn.Linear, eager
   packed, and the traced steps `generate(decode="traced")` and the server run (decode/trace.py), in
   fp32 packed and in int8 with the int8 head (`quantize/dynamic.py --head int8`): the operators by their own
   CPU time per step.
3. The machine's read bandwidth (a sum over 1 GiB of float32) for scale.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

from bench.peers.host_rates import read_bandwidth
from model.config import PRESETS, preset
from decode.steps import DecodeSteps
from model.gpt import GPT
from model.int8 import quantize_model
from model.packed_linear import PackedLinear, pack_for_inference
from runtime.cli import entry_point
from runtime.timing import environment

STREAMED_BYTES = 200e6


def product_rates(model: GPT, rows: int) -> list[tuple[str, float, float]]:
    """(shape, nn.Linear GB/s, PackedLinear GB/s) for each distinct matrix shape of `model` at `rows` rows."""
    shapes = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            shapes.setdefault(tuple(module.weight.shape), module.bias is not None)
    out = []
    for (n_out, n_in), bias in shapes.items():
        copies = max(1, int(STREAMED_BYTES // (n_out * n_in * 4)))
        plain = [nn.Linear(n_in, n_out, bias=bias) for _ in range(copies)]
        packed = [PackedLinear(linear) for linear in plain]
        x = torch.randn(rows, n_in)
        rates = []
        for layers in (plain, packed):
            with torch.inference_mode():
                for layer in layers:  # packs, and warms up
                    layer(x)
                seconds = []
                for _ in range(7):
                    start = time.perf_counter()
                    for layer in layers:
                        layer(x)
                    seconds.append((time.perf_counter() - start) / copies)
            rates.append(n_out * n_in * 4 / statistics.median(seconds) / 1e9)
        out.append((f"{n_out} x {n_in}", *rates))
    return out


def step_profile(model: GPT, batch: int, traced: bool, steps: int = 20) -> tuple[float, list[tuple[str, float, int]]]:
    """(ms per decode step, [(operator, own CPU ms per step, calls per step)]) after a 32-token prompt."""
    with torch.inference_mode():
        decode_steps = DecodeSteps(model, torch.device("cpu"), "traced" if traced else "dynamic", batch)
        cache = decode_steps.new_cache(batch, 32 + steps + 8)
        decode_steps.logits(cache, torch.randint(0, 50257, (batch, 32)), 1)
        token = torch.randint(0, 50257, (batch, 1))
        step = lambda t: decode_steps.logits(cache, t, 1)
        for _ in range(3):  # warm-up (and the trace)
            step(token)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                step(token)
            ms = (time.perf_counter() - start) / steps * 1e3
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return ms, [(e.key, e.self_cpu_time_total / 1e3 / steps, e.count // steps) for e in ops[:8]]


@entry_point
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2", choices=tuple(PRESETS), help="model preset (random weights)")
    parser.add_argument("--out", default="bench/results/decode_profile.md", help="the Markdown page to write")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    plain = GPT(preset(args.model)).eval()
    packed = copy.deepcopy(plain)
    note = pack_for_inference(packed)
    int8 = copy.deepcopy(plain)
    quantize_model(int8, head="int8")
    pack_for_inference(int8)
    env = environment(torch.device("cpu"))
    lines = [f"# Decoding step profile: {args.model} on the CPU", "",
             f"`python bench/standalone/decode_profile.py --model {args.model}` on {env.cpu}, {env.threads} threads, "
             f"torch {env.torch}, commit {env.git_commit}, {env.date}. Read bandwidth (a sum over 1 GiB): "
             f"{statistics.median(read_bandwidth()):.1f} GB/s. Ours packed: {note}.", "",
             "## Each product, weights streamed from memory (GB/s of weights read)", "",
             "| matrix (out x in) | rows | nn.Linear (MKL) | PackedLinear (one row: row blocks; more: oneDNN) "
             "| packed / plain |",
             "|---|---|---|---|---|"]
    for rows in (1, 12):
        for shape, plain_rate, packed_rate in product_rates(plain, rows):
            lines.append(f"| {shape} | {rows} | {plain_rate:.1f} | {packed_rate:.1f} | "
                         f"{packed_rate / plain_rate:.2f}x |")
    for batch in (1, 12):
        lines += ["", f"## One decode step at batch {batch}", ""]
        for label, model, traced in (("nn.Linear (MKL), eager", plain, False),
                                     ("PackedLinear, eager", packed, False),
                                     ("PackedLinear, traced", packed, True),
                                     ("int8 with the int8 head, traced", int8, True)):
            ms, ops = step_profile(model, batch, traced)
            lines += [f"{label}: {ms:.1f} ms per step (profiler on)", "",
                      "| operator | own CPU ms per step | calls per step |",
                      "|---|---|---|"]
            lines += [f"| `{name}` | {own:.2f} | {calls} |" for name, own, calls in ops]
            lines.append("")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
