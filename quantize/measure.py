"""Float and int8 side by side: loss on the same tokens, generation speed in the same run, agreement, size.

Every measurement runs both models on identical inputs, interleaved (runtime/timing.py), so that load
from other processes on a shared CPU hits both alike; speeds are medians over repeats.
"""
from __future__ import annotations

import math
import statistics
from typing import Iterable

import torch

from decode.generate import generate
from decode.sampling import SamplingParams
from runtime.progress import ProgressBar
from runtime.timing import paired_ratio, time_interleaved


@torch.inference_mode()
def paired_validation(float_model, int8_model, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                      total_batches: int | None = None) -> dict:
    """Token-weighted loss of both models on the same batches, and how often their top token agrees."""
    loss_sum = {"float": 0.0, "int8": 0.0}
    tokens = agree = 0
    for x, y in ProgressBar(batches, total=total_batches, desc="validation float vs int8", leave=False):
        counted = y != -1
        n = int(counted.sum())
        top = {}
        for name, model in (("float", float_model), ("int8", int8_model)):
            logits, loss = model(x, y)
            loss_sum[name] += float(loss) * n
            top[name] = logits.argmax(-1)
        agree += int(((top["float"] == top["int8"]) & counted).sum())
        tokens += n
    if tokens == 0:
        raise ValueError("validation received no target tokens")
    result = {}
    for name, total in loss_sum.items():
        mean = total / tokens
        result[name] = {"val_loss": mean, "val_ppl": math.exp(min(mean, 50.0))}
    result["val_tokens"] = tokens
    result["loss_increase_pct"] = 100 * (result["int8"]["val_loss"] / result["float"]["val_loss"] - 1)
    result["next_token_agreement"] = agree / tokens
    return result


def generation_speed(models: dict[str, torch.nn.Module], prompts: torch.Tensor, batch_sizes: tuple[int, ...],
                     new_tokens: int, repeats: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """Greedy generation tokens/s per model and batch size (medians), and each model's largest-batch output.

    Each repeat runs every model once per batch size, in an order that reverses every other repeat,
    after one untimed warm-up run each (runtime/timing.py).  The speed-up is the median of the
    per-repeat ratios (paired samples).
    """
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0, stop_at_eot=False)
    names = list(models)
    outputs: dict[str, torch.Tensor] = {}
    for b in batch_sizes:
        for name in names:
            outputs[name] = generate(models[name], prompts[:b], params)  # warm-up; keeps the last batch's text
    calls = {(name, b): lambda model=models[name], b=b: generate(model, prompts[:b], params)
             for b in batch_sizes for name in names}
    seconds = time_interleaved(calls, repeats, warmup=0, alternate=True, progress="generation float vs int8")
    result = {}
    for b in batch_sizes:
        row = {f"{name}_tokens_per_s": b * new_tokens / statistics.median(seconds[(name, b)]) for name in names}
        reference, candidate = names
        row["speedup"] = paired_ratio(seconds[(reference, b)], seconds[(candidate, b)])
        result[f"batch_{b}"] = row
    result.update(new_tokens=new_tokens, prompt_tokens=prompts.size(1), repeats=repeats)
    return result, outputs


def greedy_agreement(reference: torch.Tensor, candidate: torch.Tensor, prompt_tokens: int) -> dict:
    """How alike two greedy continuations of the same prompts are, position by position and as prefixes."""
    ref, cand = reference[:, prompt_tokens:], candidate[:, prompt_tokens:]
    same = ref == cand
    # Length of the identical prefix of each row: once one token differs, the texts diverge.
    prefix = same.int().cumprod(dim=1).sum(dim=1).float()
    return {"identical_tokens": float(same.float().mean()),
            "identical_prefix_fraction": float(prefix.mean() / ref.size(1)),
            "identical_rows": int(same.all(dim=1).sum()), "rows": ref.size(0)}


def prompts_from(tokens, count: int, length: int) -> torch.Tensor:
    """`count` prompts of `length` tokens taken at evenly spaced places in a token split."""
    if len(tokens) < count * length:
        raise ValueError(f"the split has {len(tokens)} tokens, too few for {count} prompts of {length}")
    stride = len(tokens) // count
    return torch.stack([torch.from_numpy(tokens[i * stride:i * stride + length].astype("int64"))
                        for i in range(count)])
