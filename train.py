"""Train GPT-2 on one device (and, through `parallel/`, on many).

    python train.py                                    # tiny model on the built-in corpus, CPU-sized
    python train.py --model gpt2 --dataset wikitext-103 --batch-size 16 --grad-accum 4 --compile
    torchrun --nproc_per_node=4 train.py --parallel fsdp          # ddp, fsdp, tp, allreduce, gather-scatter
    torchrun --nproc_per_node=4 train.py --parallel fsdp --tp-size 2   # 2D: tp inside, FSDP across

Logs to the console and to OUT/metrics.jsonl; checkpoints (model.safetensors, config.json,
training_state/) are written atomically to OUT/, and `--resume` continues exactly.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from data.corpus import DATASET_NAMES, DatasetError
from data.loader import WindowSampler, eval_batches
from data.shards import load_split
from data.tokenizer import TokenizerError
from model.artifact import (ArtifactError, artifact_writers, load_model, model_state_for_saving, roll_forward,
                            write_folder_atomically)
from model.config import PRESETS, GPTConfig, preset
from model.evaluate import evaluate_loss
from model.gpt import GPT
from model.optim import build_optimizer, lr_at
from parallel import MODES, CommsMeter, ParallelError, check_divisibility, init_distributed, parallelize, scaled_lr
from parallel.distributed import announce_failure, failed_rank, shutdown
from parallel.lr_scaling import RULES as LR_SCALING_RULES
from runtime.cli import add_dataclass_args, dataclass_from_args
from runtime.device import choose_device, peak_memory_bytes, precision_policy, synchronize
from runtime.provenance import provenance

DEFAULT_OUT_DIR = "out/train"
TRAINING_STATE = "training_state"
# Dense matmul peaks for MFU (FLOP/s); pass --peak-flops for anything else.
PEAK_FLOPS = {"A100": 312e12, "H100": 989e12, "H200": 989e12, "L4": 121e12, "A10": 125e12, "4090": 165e12}


@dataclass
class TrainConfig:
    model: str = "tiny"
    dataset: str = "builtin"
    init_from: str | None = None
    max_steps: int = 600
    batch_size: int = 8
    block_size: int | None = None
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    dropout: float = 0.0
    seed: int = 1337
    device: str = "auto"
    precision: str = "auto"
    compile: bool = False
    activation_checkpointing: bool = False
    out_dir: str = DEFAULT_OUT_DIR
    resume: bool = False
    eval_interval: int = 200
    eval_batches: int = 20
    log_interval: int = 10
    checkpoint_interval: int | None = None
    parallel: str = "none"
    tp_size: int = 1
    cpu_offload: bool = False
    scale_lr: str = "none"
    reference_batch: int | None = None
    dist_timeout_s: float = 300.0
    final_eval_batches: int | None = None
    peak_flops: float | None = None


HELP = {
    "model": f"model preset: {', '.join(PRESETS)}",
    "dataset": f"{', '.join(DATASET_NAMES)}, or a local folder with wiki.*.raw or hub-layout parquet files",
    "init_from": "start from this checkpoint or Hugging Face GPT-2 folder (fine-tuning) instead of random weights",
    "batch_size": "micro-batch size per data-parallel rank",
    "block_size": "training context length (default: the model's)",
    "grad_accum": "micro-batches accumulated per optimizer step",
    "min_lr_ratio": "cosine schedule decays to lr * this",
    "device": "auto (CUDA if present, else CPU), cpu, cuda, cuda:1, ...",
    "precision": "auto (fp32 on CPU, bf16/fp16 autocast on CUDA), fp32, bf16, fp16",
    "compile": "torch.compile the model",
    "activation_checkpointing": "recompute each block's activations in backward to save memory",
    "resume": "continue the run in --out-dir from its checkpoint",
    "eval_interval": "validate (and checkpoint) every N steps; the final validation sweeps the whole split",
    "eval_batches": "batches in the periodic validations (the same leading windows each time)",
    "checkpoint_interval": "checkpoint every N steps (default: --eval-interval)",
    "parallel": "parallelism mode: none (one device); under torchrun ddp, fsdp, tp, allreduce, gather-scatter; "
                "dp (nn.DataParallel, one process over several CUDA devices)",
    "tp_size": "tensor-parallel ranks per group; with ddp/fsdp, data parallelism runs over the rest (2D)",
    "cpu_offload": "fsdp: keep sharded parameters, gradients and optimizer state in CPU memory",
    "scale_lr": "scale --lr with the global batch relative to --reference-batch (linear or sqrt), after warmup",
    "reference_batch": "global batch (sequences) that --lr was tuned for (default: --batch-size, one rank)",
    "dist_timeout_s": "collective timeout: if a rank dies or hangs, the others stop after this many seconds",
    "final_eval_batches": "batches in the final validation (default: the whole split)",
    "peak_flops": "device peak FLOP/s for MFU (default: a table of known GPUs; none on CPU)",
}


class TrainingError(RuntimeError):
    """A problem with the arguments or data that the user can fix; printed without a traceback."""


def parse_args(argv=None) -> TrainConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_dataclass_args(parser, TrainConfig, HELP, choices={"model": tuple(PRESETS), "parallel": MODES,
                                                             "scale_lr": LR_SCALING_RULES})
    return dataclass_from_args(TrainConfig, parser.parse_args(argv))


def build_model(cfg: TrainConfig) -> tuple[GPT, GPTConfig]:
    if cfg.init_from:
        model, _ = load_model(cfg.init_from)
        if not isinstance(model, GPT):
            raise TrainingError(f"{cfg.init_from} is not a floating-point model; cannot train from it")
        model.train()
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = cfg.dropout
        model.config.dropout = cfg.dropout
        return model, model.config
    model_config = preset(cfg.model, dropout=cfg.dropout)
    torch.manual_seed(cfg.seed)
    return GPT(model_config), model_config


def validate(cfg: TrainConfig, model_config: GPTConfig) -> int:
    """Fail fast on arguments that cannot work; returns the training block size."""
    block = cfg.block_size or model_config.block_size
    if block > model_config.block_size:
        raise TrainingError(f"--block-size {block} is larger than the model's context of "
                            f"{model_config.block_size}; use --block-size <= {model_config.block_size}")
    for name in ("max_steps", "batch_size", "grad_accum", "eval_interval", "eval_batches", "log_interval"):
        if getattr(cfg, name) <= 0:
            raise TrainingError(f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}")
    for name in ("tp_size", "reference_batch", "final_eval_batches"):
        if getattr(cfg, name) is not None and getattr(cfg, name) <= 0:
            raise TrainingError(f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}")
    if cfg.block_size is not None and cfg.block_size <= 0:
        raise TrainingError(f"--block-size must be positive, got {cfg.block_size}")
    if not cfg.lr > 0:
        raise TrainingError(f"--lr must be positive, got {cfg.lr}")
    return block


def flops_per_token(config: GPTConfig, n_params: int, block: int) -> float:
    """Training FLOPs per token: 6N for the weights plus the attention scores (PaLM appendix B)."""
    return 6 * n_params + 12 * config.n_layer * config.n_embd * block


def device_peak_flops(cfg: TrainConfig, device: torch.device) -> float | None:
    if cfg.peak_flops:
        return cfg.peak_flops
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    return None


def save_checkpoint(out_dir: Path, par, model_config: GPTConfig, optimizer, sampler: WindowSampler,
                    step: int, cfg: TrainConfig, source: str | None) -> None:
    """Consolidated on every rank (collectives), written by rank 0 alone, atomically."""
    model_state = {k: v.contiguous() for k, v in par.full_model_state().items()}
    optimizer_state = par.full_optimizer_state(optimizer)
    if par.ctx.is_writer:
        state = {
            "step": step,
            "sampler": sampler.state_dict(),
            "global_batch": sampler.global_batch,
            "parallel": {"mode": cfg.parallel, "world_size": par.ctx.world_size, "tp_size": par.ctx.tp_size},
            "train_config": dataclasses.asdict(cfg),
            "torch_rng": torch.get_rng_state().tolist(),
            "cuda_rng": [s.tolist() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
        }
        writers = artifact_writers(model_state, model_config, "float", provenance("train.py", source),
                                   extra={"step": step})
        writers[f"{TRAINING_STATE}/optimizer.pt"] = lambda p: torch.save(optimizer_state, p)
        writers[f"{TRAINING_STATE}/state.json"] = lambda p: p.write_text(json.dumps(state))
        write_folder_atomically(out_dir, writers)
    if par.ctx.world_size > 1:
        dist.barrier()  # nobody reads the folder before it is complete


def restore_weights(out_dir: Path, model: GPT) -> None:
    """The full weights, into the full model, before it is parallelised."""
    loaded, _ = load_model(out_dir, "cpu")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(loaded.get_parameter(name))


def restore_training_state(out_dir: Path, par, optimizer, sampler: WindowSampler, device) -> int:
    state = json.loads((out_dir / TRAINING_STATE / "state.json").read_text())
    saved = torch.load(out_dir / TRAINING_STATE / "optimizer.pt", map_location="cpu", weights_only=True)
    par.load_optimizer_state(optimizer, saved)
    sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda_rng"]])
    return state["step"]


class MetricsLog:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a")

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()


class NullLog:
    """What ranks other than 0 log to."""

    def write(self, record: dict) -> None:
        pass


# Settings that may differ when a run is resumed; everything else comes from the checkpoint.
RESUMABLE_OVERRIDES = ("max_steps", "eval_interval", "eval_batches", "log_interval", "checkpoint_interval",
                       "device", "compile", "out_dir", "resume", "peak_flops", "parallel", "tp_size",
                       "cpu_offload", "dist_timeout_s", "final_eval_batches")


def resumed_config(cfg: TrainConfig, dp_size: int) -> TrainConfig:
    """The saved run's settings; the per-rank batch is re-derived so the global batch stays the same
    when the run resumes under another layout."""
    state_file = Path(cfg.out_dir) / TRAINING_STATE / "state.json"
    roll_forward(cfg.out_dir)
    if not state_file.exists():
        raise TrainingError(f"--resume: {cfg.out_dir} has no {TRAINING_STATE}/state.json; nothing to resume "
                            f"(drop --resume to start a new run)")
    state = json.loads(state_file.read_text())
    saved = TrainConfig(**state["train_config"])
    global_batch = state.get("global_batch", saved.batch_size)
    if global_batch % dp_size:
        raise TrainingError(f"the run was trained with a global batch of {global_batch} sequences, which "
                            f"{dp_size} data-parallel ranks cannot share evenly; resume on a divisor of {global_batch}")
    return dataclasses.replace(saved, **{k: getattr(cfg, k) for k in RESUMABLE_OVERRIDES},
                               batch_size=global_batch // dp_size)


def train(cfg: TrainConfig) -> dict:
    """Train (one process, or this rank of a torchrun job); returns the final validation record."""
    device = choose_device(cfg.device)
    ctx = init_distributed(cfg.parallel, cfg.tp_size, device, cfg.dist_timeout_s)
    try:
        return _train(cfg, ctx)
    except (TrainingError, ParallelError, DatasetError, TokenizerError, ArtifactError, ValueError, SystemExit):
        raise
    except BaseException as e:
        if ctx.world_size == 1:
            raise
        if isinstance(e, dist.DistError) or "gloo" in str(e).lower() or "nccl" in str(e).lower():
            culprit = failed_rank(ctx)
            raise TrainingError(f"rank {ctx.rank}: a collective failed ({str(e).splitlines()[0][:200]}); "
                                f"{f'rank {culprit} stopped first' if culprit else 'another rank exited or hung'}"
                                f" -- stopping (collective timeout {cfg.dist_timeout_s:g}s)") from e
        announce_failure(ctx)
        raise
    finally:
        shutdown(ctx)


def _train(cfg: TrainConfig, ctx) -> dict:
    device = ctx.device
    precision = precision_policy(device, cfg.precision)
    out_dir = Path(cfg.out_dir)
    if cfg.resume:
        cfg = resumed_config(cfg, ctx.dp_size)
    elif (out_dir / TRAINING_STATE).exists():
        raise TrainingError(f"{out_dir} already holds a training run; pass --resume to continue it or "
                            f"--out-dir to start a new one")
    say = print if ctx.is_writer else (lambda *a, **k: None)
    model, model_config = build_model(cfg)
    block = validate(cfg, model_config)
    check_divisibility(model_config, ctx, cfg.batch_size)
    if cfg.resume:
        restore_weights(out_dir, model)  # full weights first; every layout slices them the same way
    model.to(device)
    model.gradient_checkpointing = cfg.activation_checkpointing
    n_params = model.num_parameters(padded_vocab=False)
    n_params_padded = model.num_parameters()
    meter = CommsMeter()
    par = parallelize(model, ctx, meter, param_dtype=precision.autocast_dtype, cpu_offload=cfg.cpu_offload)
    if par.note:
        say(f"note: {par.note}")

    train_tokens = load_split(cfg.dataset, "train")
    val_tokens = load_split(cfg.dataset, "validation")
    sampler = WindowSampler(train_tokens, block, cfg.batch_size, seed=cfg.seed, dp_rank=ctx.dp_rank,
                            dp_size=ctx.dp_size)
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay, device_type=device.type)
    scaler = torch.amp.GradScaler(device.type, enabled=precision.needs_grad_scaler)
    max_lr = scaled_lr(cfg.lr, sampler.global_batch, cfg.reference_batch or cfg.batch_size, cfg.scale_lr)

    start_step = 0
    if cfg.resume:
        start_step = restore_training_state(out_dir, par, optimizer, sampler, device)
        say(f"resumed {out_dir} at step {start_step}")
    step_model = torch.compile(par.module) if cfg.compile else par.module
    eval_model = step_model if ctx.mode == "none" else par.eval_module

    tokens_per_step = sampler.global_batch * cfg.grad_accum * block
    peak = device_peak_flops(cfg, device)
    flops_token = flops_per_token(model_config, n_params, block)
    metrics = MetricsLog(out_dir / "metrics.jsonl") if ctx.is_writer else NullLog()
    checkpoint_every = cfg.checkpoint_interval or cfg.eval_interval
    say(f"model {cfg.init_from or cfg.model}: {n_params:,} parameters "
        f"({n_params_padded:,} with the vocabulary padded to {model_config.padded_vocab_size}); "
        f"device {device}, precision {precision.autocast_dtype or torch.float32}, "
        f"{len(train_tokens):,} training tokens, {tokens_per_step:,} tokens per step")
    if ctx.mode != "none":
        say(f"parallel {ctx.mode}: {ctx.world_size} ranks, dp {ctx.dp_size} x tp {ctx.tp_size}, "
            f"global batch {sampler.global_batch} ({cfg.batch_size} per dp rank), peak lr {max_lr:.2e}")

    phases = dict.fromkeys(("data", "forward", "backward_optimizer", "eval", "other"), 0.0)

    def run_eval(step: int, max_batches: int | None) -> dict:
        t0 = time.perf_counter()
        with meter.paused():
            result = evaluate_loss(eval_model, eval_batches(val_tokens, block, sampler.global_batch, max_batches),
                                   device, precision.autocast)
        elapsed = time.perf_counter() - t0
        phases["eval"] += elapsed
        record = {"step": step, **result, "eval_full_split": max_batches is None, "eval_s": elapsed}
        metrics.write(record)
        say(f"step {step}: val_loss {result['val_loss']:.4f} (ppl {result['val_ppl']:.1f}, "
            f"{result['val_tokens']:,} tokens{', whole split' if max_batches is None else ''})")
        return record

    def parallel_record(elapsed: float, steps: int) -> dict:
        """Communication and memory of the window, per step (rank 0's view; memory from every rank)."""
        snap = meter.snapshot()
        theory = par.theoretical_bytes(cfg.batch_size, block, cfg.grad_accum,
                                       activation_bytes=(precision.autocast_dtype or torch.float32).itemsize)
        sent = sum(snap["sent_bytes"].values())
        exposed = snap["exposed_comm_s"] if par.data_parallel in ("ddp", "allreduce", "gather-scatter") \
            else snap["comm_s"]
        peaks = [peak_memory_bytes(device)] * ctx.world_size
        if ctx.world_size > 1:
            dist.all_gather_object(peaks, peaks[0])
        return {"comm_s": snap["comm_s"] / steps, "exposed_comm_s": exposed / steps,
                "compute_s": (elapsed - exposed) / steps, "comm_share": exposed / elapsed,
                "comm_bytes": {k: v / steps for k, v in snap["payload_bytes"].items()},
                "comm_sent_bytes": {k: v / steps for k, v in snap["sent_bytes"].items()},
                "comm_sent_bytes_theory": theory["sent_bytes"],
                "bandwidth_bytes_per_s": sent / snap["comm_s"] if snap["comm_s"] else None,
                "peak_memory_bytes_per_rank": peaks, "state_bytes_this_rank": state_bytes,
                "world_size": ctx.world_size,
                "dp_size": ctx.dp_size, "tp_size": ctx.tp_size}

    model.train()
    window_start, window_tokens, window_excluded, window_steps = time.perf_counter(), 0, 0.0, 0
    last_good_step = start_step
    step = start_step
    try:
        for step in range(start_step, cfg.max_steps):
            lr = lr_at(step, max_lr, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=device)
            for micro in range(cfg.grad_accum):
                t0 = time.perf_counter()
                x, y = sampler.next_batch()
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                t1 = time.perf_counter()
                with par.gradient_sync(micro == cfg.grad_accum - 1):
                    with precision.autocast():
                        _, loss = step_model(x, y)
                        loss = loss / cfg.grad_accum
                    synchronize(device)
                    t2 = time.perf_counter()
                    scaler.scale(loss).backward()
                par.after_backward(time.perf_counter())
                loss_sum += loss.detach()
                synchronize(device)
                phases["data"] += t1 - t0
                phases["forward"] += t2 - t1
                phases["backward_optimizer"] += time.perf_counter() - t2
            t3 = time.perf_counter()
            par.sync_gradients()
            scaler.unscale_(optimizer)
            grad_norm = par.clip_grad_norm(cfg.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            if ctx.mode != "none" and step == start_step:
                state_bytes = par.local_state_bytes(optimizer)  # gradients still held, optimizer state built
            optimizer.zero_grad(set_to_none=True)
            loss_value = float(par.mean_over_data_parallel(loss_sum))  # one device sync per step
            phases["backward_optimizer"] += time.perf_counter() - t3
            if not math.isfinite(loss_value):
                raise TrainingError(f"loss became {loss_value} at step {step + 1}; stopping. The last good "
                                    f"checkpoint (step {last_good_step}) in {out_dir} is intact. Try a lower "
                                    f"--lr or --grad-clip, or fp32 precision.")
            window_tokens += tokens_per_step
            window_steps += 1
            done = step + 1
            if done % cfg.log_interval == 0 or done == cfg.max_steps:
                elapsed = time.perf_counter() - window_start - window_excluded
                phases["other"] = max(0.0, time.perf_counter() - window_start - sum(phases.values()))
                tps = window_tokens / elapsed
                record = {"step": done, "loss": loss_value, "lr": lr, "grad_norm": float(grad_norm),
                          "tokens_per_s": tps, "mfu": tps * flops_token / peak if peak else None,
                          "phase_s": {k: round(v, 4) for k, v in phases.items()},
                          "peak_memory_bytes": peak_memory_bytes(device)}
                if ctx.mode != "none":
                    record.update(parallel_record(elapsed, window_steps))
                metrics.write(record)
                mfu = f", MFU {record['mfu']:.1%}" if peak else ""
                comm = f", comm {record['comm_share']:.0%}" if "comm_share" in record else ""
                say(f"step {done}/{cfg.max_steps}: loss {loss_value:.4f}, lr {lr:.2e}, "
                    f"{tps:,.0f} tokens/s{mfu}{comm}")
                phases = dict.fromkeys(phases, 0.0)
                meter.reset()
                window_start, window_tokens, window_excluded, window_steps = time.perf_counter(), 0, 0.0, 0
            # Evaluation and checkpointing are kept out of tokens/s.
            t0 = time.perf_counter()
            if done % cfg.eval_interval == 0 and done != cfg.max_steps:
                run_eval(done, cfg.eval_batches)
            if done % checkpoint_every == 0 or done == cfg.max_steps:
                with meter.paused():
                    save_checkpoint(out_dir, par, model_config, optimizer, sampler, done, cfg, cfg.init_from)
                last_good_step = done
            window_excluded += time.perf_counter() - t0
    except KeyboardInterrupt:
        print(f"\ninterrupted at step {step}; the checkpoint of step {last_good_step} in {out_dir} is intact "
              f"(continue with --resume)", file=sys.stderr)
        raise SystemExit(130)
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if not is_out_of_memory(e):
            raise
        raise TrainingError(f"batch {cfg.batch_size} x block {block} does not fit in {device} memory; lower "
                            f"--batch-size (and raise --grad-accum to keep the batch) or use "
                            f"--activation-checkpointing") from e
    return run_eval(cfg.max_steps, cfg.final_eval_batches)


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA raises OutOfMemoryError; the CPU allocator raises a plain RuntimeError."""
    return isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in str(error)


def main(argv=None) -> None:
    cfg = parse_args(argv)
    try:
        train(cfg)
    except (TrainingError, DatasetError, TokenizerError, ArtifactError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
