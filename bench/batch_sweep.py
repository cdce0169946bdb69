"""Experiment 1: training speed against micro-batch size, up to the first out-of-memory error.

    python bench/batch_sweep.py                          # tiny preset, block 256, batches 1, 2, 4, ... 256
    python bench/batch_sweep.py --model gpt2 --max-batch 64 --memory-limit-gib 0   # on a GPU: no cap

For each micro-batch size (doubling): tokens per second of train.py's single-device step (median of
timed repeats after a warm-up) and the time one epoch-equivalent of the training split would take at
that speed.  The first size that runs out of memory ends the sweep and is reported as the limit.

On CPU a real out-of-memory ends in the kernel's OOM killer, not an exception; so by default the
sweep caps this process's address space (RLIMIT_AS) at --memory-limit-gib above its size at the
start, which turns exhaustion into an allocation failure that can be caught.  On CUDA the device's
own memory is the limit.
"""
from __future__ import annotations

import argparse
import contextlib
import sys

import torch

from bench.record import add_results_arg, plt, run_experiment, save_figure
from bench.timing import environment, summary, time_repeats
from data.loader import WindowSampler
from data.shards import load_split
from model.config import PRESETS, preset
from model.gpt import GPT
from runtime.device import choose_device, is_out_of_memory, peak_memory_bytes, precision_policy, release_memory
from training.step import TrainStep

NAME = "batch_sweep"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--model", default="tiny", choices=tuple(PRESETS))
    parser.add_argument("--dataset", default="builtin")
    parser.add_argument("--block-size", type=int, help="default: the model's context")
    parser.add_argument("--max-batch", type=int, default=256, help="largest micro-batch tried (doubling from 1)")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--memory-limit-gib", type=float, default=6.0,
                        help="CPU only: address-space cap above the starting size (0: no cap)")
    parser.add_argument("--device", default="auto")
    add_results_arg(parser)
    return parser.parse_args(argv)


def address_space_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))


@contextlib.contextmanager
def memory_cap(device: torch.device, limit_gib: float):
    """Yield a description of the cap in force (None when there is none)."""
    if device.type != "cpu" or not limit_gib:
        yield None
        return
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = address_space_bytes() + int(limit_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        yield f"address space capped at {limit_gib:g} GiB above the process's starting size (RLIMIT_AS)"
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def batch_sizes(max_batch: int) -> list[int]:
    sizes, b = [], 1
    while b <= max_batch:
        sizes.append(b)
        b *= 2
    return sizes


def sweep(args) -> dict:
    device = choose_device(args.device)
    precision = precision_policy(device)
    config = preset(args.model)
    block = args.block_size or config.block_size
    if block > config.block_size:
        sys.exit(f"error: --block-size {block} exceeds the {args.model} context of {config.block_size}")
    torch.manual_seed(0)
    model = GPT(config).to(device)
    step = TrainStep.single_device(model, device, precision)
    train_tokens = load_split(args.dataset, "train")
    rows, limit = [], None
    with memory_cap(device, args.memory_limit_gib) as cap:
        for batch in batch_sizes(args.max_batch):
            try:
                sampler = WindowSampler(train_tokens, block, batch)
            except ValueError as e:
                limit = {"batch_size": batch, "reason": f"data: {e}"}
                break
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            try:
                times = time_repeats(lambda: [step(sampler.next_batch) for _ in range(args.steps)],
                                     args.repeats, warmup=1, device=device)
            except Exception as e:
                if not is_out_of_memory(e):
                    raise
                del e  # its traceback holds the failed step's tensors
                release_memory(device)
                limit = {"batch_size": batch, "reason": "out of memory"}
                print(f"batch {batch}: out of memory -- the limit", file=sys.stderr)
                break
            tokens = args.steps * batch * block
            tps = summary([tokens / t for t in times])
            rows.append({"batch_size": batch, "tokens_per_s": tps, "step_s": summary([t / args.steps for t in times]),
                         "epoch_equivalent_s": len(train_tokens) / tps["median"],
                         "peak_memory_bytes": peak_memory_bytes(device)})
            print(f"batch {batch:>4}: {tps['median']:9,.0f} tokens/s, epoch-equivalent "
                  f"{rows[-1]['epoch_equivalent_s']:8.1f} s", file=sys.stderr)
    return {"model": args.model, "block_size": block, "dataset": args.dataset, "train_tokens": len(train_tokens),
            "steps_per_repeat": args.steps, "repeats": args.repeats, "rows": rows,
            "limit": limit or {"batch_size": None, "reason": f"no out-of-memory up to --max-batch {args.max_batch}"},
            "memory_cap": cap,
            "peak_memory_meaning": "CUDA: allocator peak at that batch size; CPU: the process's peak resident "
                                   "set so far (it never decreases, so only growth is informative)",
            "environment": environment(device)}


def plot(result: dict, path) -> str:
    rows = result["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    xs = [r["batch_size"] for r in rows]
    left.plot(xs, [r["tokens_per_s"]["median"] for r in rows], marker="o")
    left.set_ylabel("tokens / s")
    right.plot(xs, [r["epoch_equivalent_s"] for r in rows], marker="o", color="tab:orange")
    right.set_ylabel("seconds per epoch-equivalent")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("micro-batch size")
        ax.grid(alpha=0.3)
        if result["limit"]["batch_size"]:
            ax.axvline(result["limit"]["batch_size"], color="red", linestyle="--", label=result["limit"]["reason"])
            ax.legend()
    fig.suptitle(f"{result['model']}, block {result['block_size']}")
    return save_figure(fig, path)


def main(argv=None) -> dict:
    return run_experiment(NAME, argv, parse_args, sweep, plot)


if __name__ == "__main__":
    main()
