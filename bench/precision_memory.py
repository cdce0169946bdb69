"""Experiment 4: fp32 against autocast mixed precision, activation checkpointing off and on.

    python bench/precision_memory.py                     # tiny preset, batch 8, block 256, 20 steps each

Each of the four settings is a fresh `train.py` run (same seed, same batches), so peak memory is
that process's own: the CUDA allocator's peak, or on CPU the peak resident set (which includes
the ~0.3-0.5 GB of PyTorch itself, identical across settings).  Reported: time per step (median
after the first), peak memory and the loss curves side by side.  Mixed precision is bf16 autocast
on CPU (fp16 autocast is CUDA-only here) and the precision policy's choice on CUDA.  Where mixed
precision is slower than fp32 -- bf16 matrix products on CPUs without native bf16 units -- the
result says so, and a setting that cannot finish its steps in --timeout-s is reported with the
steps it managed.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

import torch

from bench.record import add_results_arg, plt, run_experiment, save_figure
from bench.runner import run_train
from bench.timing import environment
from model.config import PRESETS
from runtime.device import choose_device, precision_policy

NAME = "precision_memory"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--model", default="tiny", choices=tuple(PRESETS))
    parser.add_argument("--dataset", default="builtin")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "mixed"], choices=["fp32", "mixed"])
    parser.add_argument("--timeout-s", type=float, default=300, help="per setting; slower settings are cut off")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--work-dir", type=Path, default=Path("out/bench/precision_memory"))
    add_results_arg(parser)
    return parser.parse_args(argv)


def mixed_precision_name(device: torch.device) -> str:
    """The autocast dtype a mixed-precision run uses on this device."""
    if device.type == "cuda":
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}[precision_policy(device).autocast_dtype]
    return "bf16"


def bf16_hardware_note(device: torch.device) -> str | None:
    if device.type != "cpu":
        return None
    supported = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return (f"oneDNN reports bf16 {'supported' if supported else 'not supported'} on this CPU "
            f"({'it may still be emulated, without native bf16 matrix units' if supported else 'emulated'})")


def measure(args) -> dict:
    device = choose_device(args.device)
    mixed = mixed_precision_name(device)
    settings = [(mixed if p == "mixed" else "fp32", ckpt) for p in args.precisions for ckpt in (False, True)]
    tokens_per_step = args.batch_size * args.block_size
    rows = []
    for precision, checkpointing in settings:
        label = f"{precision}{' autocast' if precision != 'fp32' else ''}" \
                f"{' + activation checkpointing' if checkpointing else ''}"
        out_dir = args.work_dir / f"{precision}{'_ckpt' if checkpointing else ''}"
        shutil.rmtree(out_dir, ignore_errors=True)
        options = {"model": args.model, "dataset": args.dataset, "batch_size": args.batch_size,
                   "block_size": args.block_size, "max_steps": args.steps, "log_interval": 1,
                   "eval_interval": args.steps, "eval_batches": 1, "final_eval_batches": 1, "warmup_steps": 2,
                   "precision": precision, "activation_checkpointing": checkpointing, "device": args.device}
        print(f"{label}: {args.steps} steps", flush=True)
        run = run_train(out_dir, options, timeout_s=args.timeout_s)
        if not run.ok and not run.timed_out:
            rows.append({"setting": label, "precision": precision, "activation_checkpointing": checkpointing,
                         "error": run.failure()})
            continue
        records = run.step_records
        step_times = [tokens_per_step / r["tokens_per_s"] for r in records[1:]]  # the first step is warm-up
        rows.append({
            "setting": label, "precision": precision, "activation_checkpointing": checkpointing,
            "steps_done": len(records), "finished": run.ok,
            "note": None if run.ok else f"{run.failure()}: {len(records)} of {args.steps} steps done",
            "step_s": statistics.median(step_times) if step_times else None,
            "peak_memory_bytes": records[-1]["peak_memory_bytes"] if records else None,
            "losses": [r["loss"] for r in records],
        })
    fp32 = next((r for r in rows if r["precision"] == "fp32" and not r["activation_checkpointing"]
                 and r.get("step_s")), None)
    for row in rows:
        if fp32 and row.get("step_s"):
            row["time_vs_fp32"] = row["step_s"] / fp32["step_s"]
            row["memory_vs_fp32"] = row["peak_memory_bytes"] / fp32["peak_memory_bytes"]
    verdicts = []
    for row in rows:
        if row["precision"] == "fp32":
            continue
        if row.get("error"):
            verdicts.append(f"{row['setting']}: unsupported here ({row['error']})")
        elif not row["finished"] and not row.get("step_s"):
            verdicts.append(f"{row['setting']}: too slow -- not one timed step within {args.timeout_s:g}s")
        elif row.get("time_vs_fp32", 0) > 1:
            verdicts.append(f"{row['setting']}: {row['time_vs_fp32']:.2f}x the fp32 step time on this "
                            f"{device.type}")
    return {"model": args.model, "batch_size": args.batch_size, "block_size": args.block_size,
            "steps": args.steps, "mixed_precision": mixed, "rows": rows, "verdicts": verdicts,
            "bf16_hardware": bf16_hardware_note(device),
            "memory_meaning": "CUDA: allocator peak; CPU: the train.py process's peak resident set",
            "environment": environment(device)}


def plot(result: dict, path) -> str:
    rows = [r for r in result["rows"] if r.get("losses")]
    fig, (curves, times, memory) = plt.subplots(1, 3, figsize=(12, 3.6))
    for r in rows:
        curves.plot(range(1, len(r["losses"]) + 1), r["losses"], label=r["setting"],
                    linestyle="--" if r["activation_checkpointing"] else "-")
    curves.set_xlabel("step")
    curves.set_ylabel("training loss")
    curves.legend(fontsize=7)
    labels = [r["setting"].replace(" + activation checkpointing", "\n+ ckpt") for r in rows]
    times.bar(labels, [r["step_s"] or 0 for r in rows], color="tab:blue")
    times.set_ylabel("seconds per step (median)")
    memory.bar(labels, [(r["peak_memory_bytes"] or 0) / 2**20 for r in rows], color="tab:orange")
    memory.set_ylabel("peak memory (MiB)")
    for ax in (curves, times, memory):
        ax.grid(alpha=0.3)
    for ax in (times, memory):
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"{result['model']}, batch {result['batch_size']} x block {result['block_size']}")
    return save_figure(fig, path)


def main(argv=None) -> dict:
    return run_experiment(NAME, argv, parse_args, measure, plot)


if __name__ == "__main__":
    main()
