"""fp32 against autocast mixed precision, activation checkpointing off and on.

    python -m bench.experiments precision_memory         # tiny preset, batch 8, block 256, 20 steps each

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

import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiment import Experiment, TrainingSettings
from bench.plots import finish, plt
from bench.report_page import Page, mib, num, timed_as
from bench.train_runs import run_train
from runtime.cli import option
from runtime.device import choose_device, precision_policy
from runtime.timing import Environment, environment
from training.config import TrainConfig

PRECISIONS = ("fp32", "mixed")


@dataclass
class Settings(TrainingSettings):
    batch_size: int = option(8, "sequences per step", min=1)
    block_size: int = option(256, "tokens per sequence", min=1)
    steps: int = option(20, "optimizer steps per setting", min=1)
    precisions: list[str] = option(list(PRECISIONS), "fp32 and/or mixed (autocast)", choices=PRECISIONS)
    timeout_s: float = option(300, "per setting; slower settings are cut off", min=1)


@dataclass
class PrecisionRow:
    setting: str
    precision: str
    activation_checkpointing: bool
    error: str | None = None  # train.py failed (not a time-out): the other fields are empty
    steps_done: int | None = None
    finished: bool | None = None
    note: str | None = None
    step_s: float | None = None
    peak_memory_bytes: int | None = None
    losses: list[float] | None = None
    time_vs_fp32: float | None = None
    memory_vs_fp32: float | None = None


@dataclass
class PrecisionMemory:
    model: str
    batch_size: int
    block_size: int
    steps: int
    mixed_precision: str
    rows: list[PrecisionRow]
    verdicts: list[str]
    bf16_hardware: str | None
    memory_meaning: str
    environment: Environment


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


def run_setting(settings: Settings, work_dir: Path, precision: str, checkpointing: bool) -> PrecisionRow:
    label = f"{precision}{' autocast' if precision != 'fp32' else ''}" \
            f"{' + activation checkpointing' if checkpointing else ''}"
    out_dir = work_dir / f"{precision}{'_ckpt' if checkpointing else ''}"
    shutil.rmtree(out_dir, ignore_errors=True)
    config = TrainConfig(model=settings.model, dataset=settings.dataset, batch_size=settings.batch_size,
                         block_size=settings.block_size, max_steps=settings.steps, log_interval=1,
                         eval_interval=settings.steps, eval_batches=1, final_eval_batches=1, warmup_steps=2,
                         precision=precision, activation_checkpointing=checkpointing, device=settings.device,
                         curves=False)
    print(f"{label}: {settings.steps} steps", flush=True)
    run = run_train(out_dir, config, timeout_s=settings.timeout_s)
    if not run.ok and not run.timed_out:
        return PrecisionRow(label, precision, checkpointing, error=run.failure())
    records = run.step_records
    tokens_per_step = settings.batch_size * settings.block_size
    step_times = [tokens_per_step / r["tokens_per_s"] for r in records[1:]]  # the first step is warm-up
    return PrecisionRow(label, precision, checkpointing, steps_done=len(records), finished=run.ok,
                        note=None if run.ok else f"{run.failure()}: {len(records)} of {settings.steps} steps done",
                        step_s=statistics.median(step_times) if step_times else None,
                        peak_memory_bytes=records[-1]["peak_memory_bytes"] if records else None,
                        losses=[r["loss"] for r in records])


def measure(settings: Settings, work_dir: Path) -> PrecisionMemory:
    device = choose_device(settings.device)
    mixed = mixed_precision_name(device)
    rows = [run_setting(settings, work_dir, mixed if p == "mixed" else "fp32", checkpointing)
            for p in settings.precisions for checkpointing in (False, True)]
    fp32 = next((r for r in rows if r.precision == "fp32" and not r.activation_checkpointing and r.step_s), None)
    for row in rows:
        if fp32 and row.step_s:
            row.time_vs_fp32 = row.step_s / fp32.step_s
            row.memory_vs_fp32 = row.peak_memory_bytes / fp32.peak_memory_bytes
    verdicts = []
    for row in rows:
        if row.precision == "fp32":
            continue
        if row.error:
            verdicts.append(f"{row.setting}: unsupported here ({row.error})")
        elif not row.finished and not row.step_s:
            verdicts.append(f"{row.setting}: too slow -- not one timed step within {settings.timeout_s:g}s")
        elif (row.time_vs_fp32 or 0) > 1:
            verdicts.append(f"{row.setting}: {row.time_vs_fp32:.2f}x the fp32 step time on this {device.type}")
    return PrecisionMemory(settings.model, settings.batch_size, settings.block_size, settings.steps, mixed, rows,
                           verdicts, bf16_hardware_note(device),
                           "CUDA: allocator peak; CPU: the train.py process's peak resident set", environment(device))


def plot(result: PrecisionMemory):
    rows = [r for r in result.rows if r.losses]
    fig, (curves, times, memory) = plt.subplots(1, 3, figsize=(12, 4.2))
    for r in rows:
        curves.plot(range(1, len(r.losses) + 1), r.losses, label=r.setting,
                    linestyle="--" if r.activation_checkpointing else "-")
    curves.set_xlabel("step")
    curves.set_ylabel("training loss")
    curves.legend(fontsize=7, loc="upper right", bbox_to_anchor=(1, -0.2), ncol=2, frameon=False)
    labels = [r.setting.replace(" autocast", "\nautocast").replace(" + activation checkpointing", "\n+ ckpt")
              for r in rows]
    times.bar(labels, [r.step_s or 0 for r in rows], color="tab:blue")
    times.set_ylabel("seconds per step (median)")
    memory.bar(labels, [(r.peak_memory_bytes or 0) / 2**20 for r in rows], color="tab:orange")
    memory.set_ylabel("peak memory (MiB)")
    for ax in (times, memory):
        ax.tick_params(axis="x", labelsize=7)
    return finish(fig, (curves, times, memory), f"{result.model}, batch {result.batch_size} x block {result.block_size}")


def section(res: PrecisionMemory, page: Page) -> None:
    page.add(f"`{res.model}`, batch {res.batch_size} x block {res.block_size}, {res.steps} steps each, "
             f"one fresh train.py process per setting. Memory: {res.memory_meaning}.\n")
    rows = []
    for x in res.rows:
        if x.error:
            rows.append([x.setting, "failed", "", "", "", x.error])
            continue
        rows.append([x.setting, num(x.step_s, 3), num(x.time_vs_fp32, 2), mib(x.peak_memory_bytes),
                     num(x.memory_vs_fp32, 2), x.note or f"{x.steps_done} steps, final loss {x.losses[-1]:.3f}"])
    page.add(timed_as("a fresh `train.py` process per setting (fp32 or bf16 autocast, checkpointing off or on), one "
                      "after another",
                      "not overlapped: each run's first step is left out"))
    page.table(["setting", "s/step", "time vs fp32", "peak MiB", "memory vs fp32", "run"], rows)
    for x in res.rows:
        if x.precision == "fp32":
            continue
        if x.error:
            page.add(f"- **{x.setting}: unsupported here** ({x.error})")
        elif not x.step_s:
            page.add(f"- **{x.setting}: too slow** -- {x.note}")
        elif x.time_vs_fp32:
            page.add(f"- **{x.setting}: {x.time_vs_fp32:.2f}x the fp32 step time "
                     f"({'slower' if x.time_vs_fp32 > 1 else 'faster'}) on this {res.environment.device_type}**")
    if res.bf16_hardware:
        page.add(f"- {res.bf16_hardware}")
    page.add("")


EXPERIMENT = Experiment(
    name="precision_memory", title="Precision and memory", about=__doc__, settings=Settings,
    quick=Settings(block_size=128, steps=8, timeout_s=180), full=Settings(steps=50, timeout_s=900),
    result=PrecisionMemory, measure=measure, plot=plot, section=section)
