"""DDP, FSDP and tensor parallelism against one device, from one command: do they train the same model (the loss of
every step equal to the single device's), and how does each scale at a fixed global batch (strong scaling)?

    python -m bench.standalone.multi_device                                  # 2 ranks: 2 GPUs (NCCL) or, without, 2 CPU ranks
    python -m bench.standalone.multi_device --ranks 2 4 --model gpt2 --block-size 1024 --global-batch 8 --steps 20

Every run is train.py itself, as a user starts it: the reference in one process, each mode under torchrun at each
rank count, all with the same seed, data, global batch and precision, one log record a step.  Equality: each step's
loss and the final validation loss within `--tolerance` (relative) of the reference's.  Scaling: tokens/s over the
steps after `--warmup-steps`, speedup = that over the single device's, efficiency = speedup / ranks.  The device is
train.py's choice (`--device auto`: CUDA with NCCL where torch sees GPUs, else the CPU with gloo), so the same command
checks a 2-4 GPU machine and, cheaply, a laptop.  Writes --out (JSON: every run's losses and rates, the environment,
the host's rates on a CPU) and prints two tables; ends with one `error:` line and exit status 1 when a mode is not equal.  docs/cuda.md has the recipe.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

from bench.record import RESULTS_DIR
from bench.train_runs import TrainRun, run_train
from model.config import PRESETS, preset
from parallel.layout import parallel_dims
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.device import choose_device
from runtime.errors import UserError
from runtime.timing import environment
from training.config import TrainConfig

MODES = ("ddp", "fsdp", "tp")
WORK = Path("out/bench/multi_device")


@dataclass
class MultiDeviceConfig:
    ranks: list[int] = option([2], "rank counts to run each mode on (each at most the GPUs on a CUDA machine)", min=1)
    modes: list[str] = option(list(MODES), "the layouts checked against one device", choices=MODES)
    model: str = option("tiny", "model preset (random weights, the same seed in every run)", choices=tuple(PRESETS))
    dataset: str = option("builtin", "training and validation text (train.py's --dataset)")
    device: str = option("auto", "auto (CUDA with NCCL where torch sees GPUs, else the CPU with gloo), cpu")
    precision: str = option("fp32", "fp32 for a tight equality check; bf16 for GPU speed (then loosen --tolerance)",
                            choices=("auto", "fp32", "bf16", "fp16"))
    block_size: int = option(128, "tokens per sequence", min=1)
    global_batch: int = option(8, "sequences per step over all ranks", min=1)
    steps: int = option(8, "optimizer steps of every run", min=1)
    warmup_steps: int = option(2, "steps left out of the tokens/s", min=0)
    tolerance: float = option(1e-4, "relative loss difference still called equal", above=0)
    threads: int = option(1, "OMP_NUM_THREADS per rank (CPU ranks)", min=1)
    timeout_s: float = option(1800.0, "per train.py job", above=0)
    out: Path = option(RESULTS_DIR / "multi_device.json", "the JSON written")

    def __post_init__(self):
        check_options(self, UserError)
        if self.warmup_steps >= self.steps:
            raise UserError(f"--warmup-steps {self.warmup_steps} leaves no step of the {self.steps} to time; give "
                            f"fewer than --steps")
        context = preset(self.model).block_size
        if self.block_size > context:
            raise UserError(f"--block-size {self.block_size} is longer than {self.model}'s context of {context}")
        for ranks in self.ranks:
            for mode in self.modes:
                dp = parallel_dims(mode, 1, ranks).dp
                if self.global_batch % dp:
                    raise UserError(f"--global-batch {self.global_batch} does not split over the {dp} data-parallel "
                                    f"ranks of {mode} on {ranks}; give a multiple of {dp}")


@dataclasses.dataclass
class Run:
    mode: str  # "none": the single-device reference
    ranks: int
    command: str
    losses: list[float]
    val_loss: float
    tokens_per_s: float  # median over the steps after the warm-up
    max_relative_loss_diff: float | None = None  # against the reference; None for the reference itself
    equal: bool | None = None
    speedup: float | None = None
    efficiency: float | None = None


def one_run(cfg: MultiDeviceConfig, mode: str, ranks: int) -> Run:
    dims = parallel_dims(mode, 1, ranks) if mode != "none" else None
    dp = dims.dp if dims else 1
    out_dir = WORK / f"{mode}_{ranks}"
    shutil.rmtree(out_dir, ignore_errors=True)  # this script's own scratch run from last time
    config = TrainConfig(model=cfg.model, dataset=cfg.dataset, device=cfg.device, precision=cfg.precision,
                         block_size=cfg.block_size, batch_size=cfg.global_batch // dp, max_steps=cfg.steps,
                         warmup_steps=1, log_interval=1, eval_interval=cfg.steps, eval_batches=1,
                         final_eval_batches=2, curves=False, parallel=mode, tp_size=dims.tp if dims else 1)
    print(f"{mode} on {ranks} rank(s)", flush=True)
    run: TrainRun = run_train(out_dir, config, nproc=ranks if dims else None, threads=cfg.threads,
                              timeout_s=cfg.timeout_s)
    shutil.rmtree(out_dir, ignore_errors=True)
    if not run.ok:
        raise UserError(f"{mode} on {ranks} rank(s) failed: {run.failure()}")
    steps = run.step_records
    timed = [r["tokens_per_s"] for r in steps[cfg.warmup_steps:]] or [steps[-1]["tokens_per_s"]]
    val = [r["val_loss"] for r in run.records if "val_loss" in r][-1]
    return Run(mode, ranks, " ".join(run.command), [r["loss"] for r in steps], val, statistics.median(timed))


def compare(run: Run, reference: Run, tolerance: float) -> None:
    pairs = list(zip(run.losses + [run.val_loss], reference.losses + [reference.val_loss], strict=True))
    run.max_relative_loss_diff = max(abs(a - b) / abs(b) for a, b in pairs)
    run.equal = run.max_relative_loss_diff <= tolerance
    run.speedup = run.tokens_per_s / reference.tokens_per_s
    run.efficiency = run.speedup / run.ranks


def tables(runs: list[Run], reference: Run, tolerance: float) -> str:
    lines = [f"Equality against one device (largest relative difference of the {len(reference.losses)} step losses "
             f"and the validation loss; tolerance {tolerance:g}):", "",
             "| mode | ranks | max relative diff | equal |", "|---|---|---|---|"]
    lines += [f"| {r.mode} | {r.ranks} | {r.max_relative_loss_diff:.2e} | {'yes' if r.equal else 'NO'} |" for r in runs]
    lines += ["", f"Strong scaling (same global batch; one device: {reference.tokens_per_s:,.0f} tokens/s):", "",
              "| mode | ranks | tokens/s | speedup | efficiency |", "|---|---|---|---|---|"]
    lines += [f"| {r.mode} | {r.ranks} | {r.tokens_per_s:,.0f} | {r.speedup:.2f}x | {r.efficiency:.0%} |"
              for r in runs]
    return "\n".join(lines)


def measure(cfg: MultiDeviceConfig) -> dict:
    reference = one_run(cfg, "none", 1)
    runs = []
    for ranks in cfg.ranks:
        for mode in cfg.modes:
            run = one_run(cfg, mode, ranks)
            compare(run, reference, cfg.tolerance)
            runs.append(run)
    device = choose_device(cfg.device)
    result = {"settings": {**dataclasses.asdict(cfg), "out": str(cfg.out)}, "reference": dataclasses.asdict(reference),
              "runs": [dataclasses.asdict(r) for r in runs], "environment": dataclasses.asdict(environment(device)),
              "table": tables(runs, reference, cfg.tolerance)}
    if device.type == "cpu":
        from bench.peers.host_rates import measure_in_process
        result["host_rates"] = vars(measure_in_process(threads=cfg.threads))
        result["host_note"] = "CPU ranks share the host's cores: scaling here measures contention, not devices"
    return result


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(MultiDeviceConfig, __doc__, argv)
    result = measure(cfg)
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    cfg.out.write_text(json.dumps(result, indent=1) + "\n")
    print(result["table"])
    print(f"written to {cfg.out}")
    unequal = [f"{r['mode']} on {r['ranks']}" for r in result["runs"] if not r["equal"]]
    if unequal:
        raise UserError(f"{', '.join(unequal)} rank(s) did not train the single device's model (losses differ by "
                        f"more than {cfg.tolerance:g}); see {cfg.out}")


if __name__ == "__main__":
    main()
