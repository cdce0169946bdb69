"""Each rank's peak memory when a model is sharded: once the run is built (a torchrun job that builds train.py's
Trainer and takes no step), and through a few steps at a small batch (a torchrun job of train.py, read back from its
metrics.jsonl), beside what the rank's shard holds (parameters, gradients, optimizer state).

    python -m bench.standalone.shard_memory --mode tp --world-size 4 --model gpt2-medium --label after
    python -m bench.standalone.shard_memory --mode fsdp --world-size 4 --model gpt2-medium --label after

Writes bench/results/shard_memory/ (--results-dir)<model>_<mode>x<world>_<label>.json.  On the CPU a rank's peak is its process's
peak resident set (VmHWM: PyTorch's own libraries included, about 0.4 GB a rank), so "peak minus state" is what the
run held beyond its shard: the libraries, the activations of the small batch, and, before the ranks built on the
meta device, the whole model each rank made before taking its slice.  The peaks are read from the last step's
record, before the run's closing checkpoint (whose consolidation on rank 0 is a separate, documented cost).  Run
one configuration at a time: at GPT-2 Medium four ranks that each build the whole model hold about 6 GB together.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.peers.host_rates import measure_in_process
from bench.processes import STDOUT, run_command
from bench.train_runs import run_train
from bench.record import RESULTS_DIR
from model.config import PRESETS, preset
from parallel.layout import parallel_dims
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.errors import UserError
from runtime.provenance import git_commit
from training.config import TrainConfig

WORK = Path("out/bench/shard_memory")


@dataclass
class ShardMemoryConfig:
    mode: str = option("tp", "the sharding layout", choices=("tp", "fsdp"))
    world_size: int = option(4, "ranks", min=1)
    model: str = option("gpt2-medium", "model preset (random weights)", choices=tuple(PRESETS))
    batch_size: int = option(1, "sequences per data-parallel rank", min=1)
    block_size: int = option(64, "tokens per sequence", min=1)
    steps: int = option(2, "optimizer steps of the training job", min=1)
    threads: int = option(1, "OMP_NUM_THREADS per rank", min=1)
    timeout_s: float = option(1800.0, "per torchrun job", above=0)
    label: str = option("", "names the result file: before, after, ...")
    results_dir: Path = option(RESULTS_DIR / "shard_memory", "where the result file goes")

    def __post_init__(self):
        check_options(self, UserError)
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", self.label):
            raise UserError(f"--label {self.label!r}: give a short name of letters, digits, '.', '_' or '-' "
                            f"(before, after)")
        context = preset(self.model).block_size
        if self.block_size > context:
            raise UserError(f"--block-size {self.block_size} is longer than {self.model}'s context of {context}")


def measure_build(config: TrainConfig, world: int, threads: int, timeout_s: float) -> dict:
    """Each rank's peak once the run is built, before its first step (bench/shard_memory_build.py)."""
    out_dir = Path(config.out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", "-m",
               "bench.standalone.shard_memory_build", json.dumps(dataclasses.asdict(config))]
    done = run_command(command, threads=threads, timeout_s=timeout_s, stderr=STDOUT)
    shutil.rmtree(out_dir, ignore_errors=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not done.ok or not lines:
        tail = done.stdout.strip().splitlines()[-1:] or [""]
        raise UserError(f"the build-only job failed (exit code {done.returncode}): {tail[0]}")
    return json.loads(lines[-1])


def measure(mode: str, world: int, model: str, batch: int, block: int, steps: int, threads: int,
            timeout_s: float) -> dict:
    dims = parallel_dims(mode, 1, world)
    out_dir = WORK / f"{model}_{mode}x{world}"
    shutil.rmtree(out_dir, ignore_errors=True)  # this script's own scratch run from last time
    config = TrainConfig(model=model, block_size=block, batch_size=batch, max_steps=steps, parallel=mode,
                         tp_size=dims.tp, warmup_steps=1, log_interval=1, eval_interval=steps, eval_batches=1,
                         final_eval_batches=1, curves=False, device="cpu", out_dir=str(out_dir))
    load_before = os.getloadavg()
    built = measure_build(dataclasses.replace(config, out_dir=str(out_dir) + "_build"), world, threads, timeout_s)
    run = run_train(out_dir, config, nproc=world, threads=threads, timeout_s=timeout_s)
    load_after = os.getloadavg()
    shutil.rmtree(out_dir, ignore_errors=True)  # gigabytes of checkpoint at GPT-2 Medium
    if not run.ok or not run.step_records:
        raise UserError(f"the {mode} x{world} job failed: {run.failure()}")
    last = run.step_records[-1]
    peaks = last["peak_memory_bytes_per_rank"]
    state = last["state_bytes_this_rank"]
    return {
        **built,
        "built_peak_meaning": "each rank's peak resident set once train.py's Trainer has built the run (model laid "
                              "out, data, optimizer), before the first step: no optimizer state exists yet",
        "model": model, "mode": mode, "world_size": world, "tp_size": dims.tp, "dp_size": dims.dp,
        "batch_per_rank": batch, "block_size": block, "steps": steps, "threads_per_rank": threads,
        "peak_memory_bytes_per_rank": peaks, "peak_memory_bytes_max_rank": max(peaks),
        "state_bytes_rank0": state, "state_bytes_rank0_total": sum(state.values()),
        "peak_minus_state_bytes_max_rank": max(peaks) - sum(state.values()),
        "peak_meaning": "each rank process's peak resident set (VmHWM) up to the last step, before the closing save",
        "command": " ".join(run.command), "elapsed_s": run.elapsed_s,
        "load_average_before": load_before, "load_average_after": load_after,
    }


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(ShardMemoryConfig, __doc__, argv)
    rates = measure_in_process(threads=1)
    result = measure(cfg.mode, cfg.world_size, cfg.model, cfg.batch_size, cfg.block_size, cfg.steps, cfg.threads,
                     cfg.timeout_s)
    result.update(label=cfg.label, git_commit=git_commit(), host_rates=vars(rates),
                  host_note="a 2-core host shared with other engineers' jobs: the load averages are the job's")
    cfg.results_dir.mkdir(parents=True, exist_ok=True)
    path = cfg.results_dir / f"{cfg.model}_{cfg.mode}x{cfg.world_size}_{cfg.label}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    gib = lambda peaks: ", ".join(f"{p / 2**30:.2f}" for p in peaks)
    print(f"{cfg.mode} x{cfg.world_size} {cfg.model}: built {gib(result['built_peak_memory_bytes_per_rank'])} GiB, "
          f"through {cfg.steps} steps {gib(result['peak_memory_bytes_per_rank'])} GiB per rank; rank 0's shard "
          f"(parameters, gradients, optimizer state) {result['state_bytes_rank0_total'] / 2**30:.2f} GiB; {path}")


if __name__ == "__main__":
    main()
