"""Train GPT-2 on one device (and, through `parallel/`, on many).

    python train.py                                    # tiny model on the built-in corpus, CPU-sized
    python train.py --model gpt2 --dataset wikitext-103 --batch-size 16 --grad-accum 4 --compile

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

from data.corpus import DATASET_NAMES, DatasetError
from data.loader import WindowSampler, eval_batches
from data.shards import load_split
from data.tokenizer import TokenizerError
from model.artifact import (ArtifactError, artifact_writers, load_model, model_state_for_saving, provenance,
                            roll_forward, write_folder_atomically)
from model.cli import add_dataclass_args, dataclass_from_args
from model.config import PRESETS, GPTConfig, preset
from model.device import choose_device, peak_memory_bytes, precision_policy, synchronize
from model.evaluate import evaluate_loss
from model.gpt import GPT
from model.optim import build_optimizer, lr_at

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
    "parallel": "parallelism mode (none: one device)",
    "peak_flops": "device peak FLOP/s for MFU (default: a table of known GPUs; none on CPU)",
}


class TrainingError(RuntimeError):
    """A problem with the arguments or data that the user can fix; printed without a traceback."""


def parse_args(argv=None) -> TrainConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_dataclass_args(parser, TrainConfig, HELP, choices={"model": tuple(PRESETS), "parallel": ("none",)})
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


def save_checkpoint(out_dir: Path, model, model_config: GPTConfig, optimizer, sampler: WindowSampler,
                    step: int, cfg: TrainConfig, source: str | None) -> None:
    state = {
        "step": step,
        "sampler": sampler.state_dict(),
        "train_config": dataclasses.asdict(cfg),
        "torch_rng": torch.get_rng_state().tolist(),
        "cuda_rng": [s.tolist() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }
    writers = artifact_writers(model_state_for_saving(model), model_config, "float",
                               provenance("train.py", source), extra={"step": step})
    writers[f"{TRAINING_STATE}/optimizer.pt"] = lambda p: torch.save(optimizer.state_dict(), p)
    writers[f"{TRAINING_STATE}/state.json"] = lambda p: p.write_text(json.dumps(state))
    write_folder_atomically(out_dir, writers)


def restore_checkpoint(out_dir: Path, model: GPT, optimizer, sampler: WindowSampler, device) -> int:
    state_file = out_dir / TRAINING_STATE / "state.json"
    loaded, _ = load_model(out_dir, device)
    model.load_state_dict(loaded.state_dict())
    optimizer.load_state_dict(torch.load(out_dir / TRAINING_STATE / "optimizer.pt", map_location=device,
                                         weights_only=True))
    state = json.loads(state_file.read_text())
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


# Settings that may differ when a run is resumed; everything else comes from the checkpoint.
RESUMABLE_OVERRIDES = ("max_steps", "eval_interval", "eval_batches", "log_interval", "checkpoint_interval",
                       "device", "compile", "out_dir", "resume", "peak_flops")


def resumed_config(cfg: TrainConfig) -> TrainConfig:
    state_file = Path(cfg.out_dir) / TRAINING_STATE / "state.json"
    roll_forward(cfg.out_dir)
    if not state_file.exists():
        raise TrainingError(f"--resume: {cfg.out_dir} has no {TRAINING_STATE}/state.json; nothing to resume "
                            f"(drop --resume to start a new run)")
    saved = TrainConfig(**json.loads(state_file.read_text())["train_config"])
    return dataclasses.replace(saved, **{k: getattr(cfg, k) for k in RESUMABLE_OVERRIDES})


def train(cfg: TrainConfig) -> dict:
    device = choose_device(cfg.device)
    precision = precision_policy(device, cfg.precision)
    out_dir = Path(cfg.out_dir)
    if cfg.resume:
        cfg = resumed_config(cfg)
    elif (out_dir / TRAINING_STATE).exists():
        raise TrainingError(f"{out_dir} already holds a training run; pass --resume to continue it or "
                            f"--out-dir to start a new one")
    model, model_config = build_model(cfg)
    block = validate(cfg, model_config)
    model.to(device)
    model.gradient_checkpointing = cfg.activation_checkpointing

    train_tokens = load_split(cfg.dataset, "train")
    val_tokens = load_split(cfg.dataset, "validation")
    sampler = WindowSampler(train_tokens, block, cfg.batch_size, seed=cfg.seed)
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay, device_type=device.type)
    scaler = torch.amp.GradScaler(device.type, enabled=precision.needs_grad_scaler)

    start_step = 0
    if cfg.resume:
        start_step = restore_checkpoint(out_dir, model, optimizer, sampler, device)
        print(f"resumed {out_dir} at step {start_step}")
    step_model = torch.compile(model) if cfg.compile else model

    n_params = model.num_parameters(padded_vocab=False)
    tokens_per_step = cfg.batch_size * cfg.grad_accum * block
    peak = device_peak_flops(cfg, device)
    flops_token = flops_per_token(model_config, n_params, block)
    metrics = MetricsLog(out_dir / "metrics.jsonl")
    checkpoint_every = cfg.checkpoint_interval or cfg.eval_interval
    print(f"model {cfg.init_from or cfg.model}: {n_params:,} parameters "
          f"({model.num_parameters():,} with the vocabulary padded to {model_config.padded_vocab_size}); "
          f"device {device}, precision {precision.autocast_dtype or torch.float32}, "
          f"{len(train_tokens):,} training tokens, {tokens_per_step:,} tokens per step")

    phases = dict.fromkeys(("data", "forward", "backward_optimizer", "eval", "other"), 0.0)

    def run_eval(step: int, max_batches: int | None) -> dict:
        t0 = time.perf_counter()
        result = evaluate_loss(step_model, eval_batches(val_tokens, block, cfg.batch_size, max_batches),
                               device, precision.autocast)
        elapsed = time.perf_counter() - t0
        phases["eval"] += elapsed
        record = {"step": step, **result, "eval_full_split": max_batches is None, "eval_s": elapsed}
        metrics.write(record)
        print(f"step {step}: val_loss {result['val_loss']:.4f} (ppl {result['val_ppl']:.1f}, "
              f"{result['val_tokens']:,} tokens{', whole split' if max_batches is None else ''})")
        return record

    model.train()
    window_start, window_tokens, window_excluded = time.perf_counter(), 0, 0.0
    last_good_step = start_step
    step = start_step
    try:
        for step in range(start_step, cfg.max_steps):
            step_start = time.perf_counter()
            lr = lr_at(step, cfg.lr, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=device)
            for _ in range(cfg.grad_accum):
                t0 = time.perf_counter()
                x, y = sampler.next_batch()
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                t1 = time.perf_counter()
                with precision.autocast():
                    _, loss = step_model(x, y)
                    loss = loss / cfg.grad_accum
                synchronize(device)
                t2 = time.perf_counter()
                scaler.scale(loss).backward()
                loss_sum += loss.detach()
                phases["data"] += t1 - t0
                phases["forward"] += t2 - t1
            t3 = time.perf_counter()
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            loss_value = float(loss_sum)  # one device sync per step
            phases["backward_optimizer"] += time.perf_counter() - t3
            if not math.isfinite(loss_value):
                raise TrainingError(f"loss became {loss_value} at step {step + 1}; stopping. The last good "
                                    f"checkpoint (step {last_good_step}) in {out_dir} is intact. Try a lower "
                                    f"--lr or --grad-clip, or fp32 precision.")
            window_tokens += tokens_per_step
            done = step + 1
            if done % cfg.log_interval == 0 or done == cfg.max_steps:
                elapsed = time.perf_counter() - window_start - window_excluded
                phases["other"] = max(0.0, time.perf_counter() - window_start - sum(phases.values()))
                tps = window_tokens / elapsed
                record = {"step": done, "loss": loss_value, "lr": lr, "grad_norm": float(grad_norm),
                          "tokens_per_s": tps, "mfu": tps * flops_token / peak if peak else None,
                          "phase_s": {k: round(v, 4) for k, v in phases.items()},
                          "peak_memory_bytes": peak_memory_bytes(device)}
                metrics.write(record)
                mfu = f", MFU {record['mfu']:.1%}" if peak else ""
                print(f"step {done}/{cfg.max_steps}: loss {loss_value:.4f}, lr {lr:.2e}, "
                      f"{tps:,.0f} tokens/s{mfu}")
                phases = dict.fromkeys(phases, 0.0)
                window_start, window_tokens, window_excluded = time.perf_counter(), 0, 0.0
            # Evaluation and checkpointing are kept out of tokens/s.
            t0 = time.perf_counter()
            if done % cfg.eval_interval == 0 and done != cfg.max_steps:
                run_eval(done, cfg.eval_batches)
            if done % checkpoint_every == 0 or done == cfg.max_steps:
                save_checkpoint(out_dir, model, model_config, optimizer, sampler, done, cfg, cfg.init_from)
                last_good_step = done
            window_excluded += time.perf_counter() - t0
    except KeyboardInterrupt:
        print(f"\ninterrupted at step {step}; the checkpoint of step {last_good_step} in {out_dir} is intact "
              f"(continue with --resume)", file=sys.stderr)
        raise SystemExit(130)
    except torch.OutOfMemoryError as e:
        raise TrainingError(f"batch {cfg.batch_size} x block {block} does not fit in {device} memory; lower "
                            f"--batch-size (and raise --grad-accum to keep the batch) or use "
                            f"--activation-checkpointing") from e
    return run_eval(cfg.max_steps, None)


def main(argv=None) -> None:
    cfg = parse_args(argv)
    try:
        train(cfg)
    except (TrainingError, DatasetError, TokenizerError, ArtifactError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
