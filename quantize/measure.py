"""Float and int8 side by side: loss on the same tokens, generation speed in the same run, agreement, size.

Every measurement runs both models on identical inputs, interleaved (runtime/timing.py), so that load
from other processes on a shared CPU hits both alike; speeds are medians over repeats.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Iterable

import torch

from decode.generate import generate
from decode.sampling import SamplingParams
from runtime.progress import ProgressBar
from runtime.timing import MIN_NOISE_FLOOR, noise_floor, paired_ratio, time_interleaved


@torch.inference_mode()
def paired_validation(float_model, int8_model, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                      total_batches: int | None = None,
                      on_first_batch: Callable[[float], None] | None = None) -> dict:
    """Token-weighted loss of both models on the same batches, and how often their top token agrees;
    `on_first_batch` is told the first batch's seconds (for the run's estimate)."""
    loss_sum = {"float": 0.0, "int8": 0.0}
    tokens = agree = 0
    start = time.perf_counter()
    for x, y in ProgressBar(batches, total=total_batches, desc="validation float vs int8", leave=False):
        counted = y != -1
        n = int(counted.sum())
        top = {}
        for name, model in (("float", float_model), ("int8", int8_model)):
            logits, loss = model(x, y)
            loss_sum[name] += float(loss) * n
            top[name] = logits.argmax(-1)
        agree += int(((top["float"] == top["int8"]) & counted).sum())
        if tokens == 0 and on_first_batch is not None:
            on_first_batch(time.perf_counter() - start)
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


AGAIN = "float again"  # the float model timed a second time in every round: the run's noise floor


def generation_warm_up(models: dict[str, torch.nn.Module], prompts: torch.Tensor, batch_sizes: tuple[int, ...],
                       new_tokens: int) -> tuple[dict[str, torch.Tensor], float]:
    """One untimed greedy generation per model and batch size (also the first unit of work the estimate is made
    from): each model's largest-batch output, and the seconds it all took."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0, stop_at_eot=False)
    outputs: dict[str, torch.Tensor] = {}
    start = time.perf_counter()
    for b in batch_sizes:
        for name, model in models.items():
            outputs[name] = generate(model, prompts[:b], params)  # keeps the last (largest) batch's text
    return outputs, time.perf_counter() - start


def generation_speed(models: dict[str, torch.nn.Module], prompts: torch.Tensor, batch_sizes: tuple[int, ...],
                     new_tokens: int, repeats: int) -> dict:
    """Greedy generation tokens/s per model and batch size (medians), after `generation_warm_up`.

    Each repeat runs every model once per batch size, and the first model (the reference) once more, in an order
    that reverses every other repeat (runtime/timing.py).  The speed-up is the median of the per-repeat ratios
    (paired samples); the reference against itself gives the noise floor of that ratio in this run.
    """
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0, stop_at_eot=False)
    (reference, candidate), timed = list(models), {**models, AGAIN: next(iter(models.values()))}
    calls = {(name, b): lambda model=model, b=b: generate(model, prompts[:b], params)
             for b in batch_sizes for name, model in timed.items()}
    seconds = time_interleaved(calls, repeats, warmup=0, alternate=True, progress="generation float vs int8")
    result = {}
    for b in batch_sizes:
        row = {f"{name}_tokens_per_s": b * new_tokens / statistics.median(seconds[(name, b)]) for name in models}
        row["speedup"] = paired_ratio(seconds[(reference, b)], seconds[(candidate, b)])
        row["float_against_itself"] = paired_ratio(seconds[(reference, b)], seconds[(AGAIN, b)])
        row["noise_floor"] = noise_floor(row["float_against_itself"])
        result[f"batch_{b}"] = row
    result.update(new_tokens=new_tokens, prompt_tokens=prompts.size(1), repeats=repeats,
                  noise_floor_method=f"the {reference} model timed twice in every repeat; the floor is how far that "
                                     f"ratio strays from 1, at least {MIN_NOISE_FLOOR:.0%}")
    return result


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
