"""Experiment 3: where a training run's time goes -- data, forward, backward, optimizer, evaluation, other.

    python bench/phase_profile.py                        # tiny preset, batch 8, block 256, 30 steps, eval every 10

Runs train.py's single-device step with the device synchronised at every phase boundary (which
costs a little on CUDA and nothing on CPU), evaluating on --eval-batches validation batches every
--eval-interval steps as train.py does.  "other" is the wall time outside the named phases (the
loop, reading the loss).  Then a few more steps run under torch.profiler: its Chrome trace is
written beside the results (open it in chrome://tracing or https://ui.perfetto.dev) and its ten most
expensive operators go into the JSON.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench.record import add_results_arg, plt, run_experiment, save_figure
from bench.timing import environment
from data.loader import WindowSampler, eval_batches
from data.shards import load_split
from model.config import PRESETS, preset
from model.evaluate import evaluate_loss
from model.gpt import GPT
from runtime.device import choose_device, precision_policy
from training.metrics import PHASES, PhaseClock
from training.step import TrainStep

NAME = "phase_profile"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--model", default="tiny", choices=tuple(PRESETS))
    parser.add_argument("--dataset", default="builtin")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block-size", type=int, help="default: the model's context")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval-interval", type=int, default=10)
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--profile-steps", type=int, default=3, help="steps recorded by torch.profiler")
    parser.add_argument("--device", default="auto")
    add_results_arg(parser)
    return parser.parse_args(argv)


def measure(args) -> dict:
    device = choose_device(args.device)
    precision = precision_policy(device)
    config = preset(args.model)
    block = args.block_size or config.block_size
    torch.manual_seed(0)
    model = GPT(config).to(device)
    step = TrainStep.single_device(model, device, precision)
    sampler = WindowSampler(load_split(args.dataset, "train"), block, args.batch_size)
    val_tokens = load_split(args.dataset, "validation")
    step(sampler.next_batch)  # warm-up, untimed

    clock = PhaseClock(device)
    start = time.perf_counter()
    for i in range(1, args.steps + 1):
        step(sampler.next_batch, clock=clock)
        if i % args.eval_interval == 0:
            with clock("evaluation"):
                evaluate_loss(model, eval_batches(val_tokens, block, args.batch_size, args.eval_batches), device,
                              precision.autocast)
    total = time.perf_counter() - start
    seconds = {phase: clock.seconds.get(phase, 0.0) for phase in PHASES}
    seconds["other"] += max(0.0, total - sum(seconds.values()))

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=False) as prof:
        for _ in range(args.profile_steps):
            step(sampler.next_batch)
    trace = args.results_dir / f"{NAME}.trace.json"
    args.results_dir.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace))
    sort_key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    top = sorted(prof.key_averages(), key=lambda e: getattr(e, sort_key), reverse=True)
    top_ops = [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                "self_device_ms": e.self_device_time_total / 1e3} for e in top[:10]]
    return {"model": args.model, "batch_size": args.batch_size, "block_size": block, "steps": args.steps,
            "eval_interval": args.eval_interval, "eval_batches": args.eval_batches, "total_s": total,
            "phase_s": seconds, "phase_share": {k: v / total for k, v in seconds.items()},
            "step_s": (total - seconds["evaluation"]) / args.steps,
            "profiler": {"steps": args.profile_steps, "trace": trace.name, "top_ops": top_ops},
            "environment": environment(device)}


def plot(result: dict, path) -> str:
    shares = {k: v for k, v in result["phase_s"].items() if v > 0}
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.pie(list(shares.values()), labels=[f"{k} {v / result['total_s']:.0%}" for k, v in shares.items()],
           startangle=90, counterclock=False)
    ax.set_title(f"{result['model']}: {result['steps']} steps of batch {result['batch_size']} x "
                 f"{result['block_size']}, eval every {result['eval_interval']}")
    return save_figure(fig, path)


def main(argv=None) -> dict:
    return run_experiment(NAME, argv, parse_args, measure, plot)


if __name__ == "__main__":
    main()
