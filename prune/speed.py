"""Measured (never projected) forward and generation throughput of several models, interleaved, and
what it says of a pruned model against the dense one (and of storing its zeros in sparse CSR format).

The models are timed in turns within each repeat (runtime/timing.py), so a change in machine load
hits all of them alike; each figure is the median over the repeats after one warm-up round.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from decode.generate import generate
from model.gpt import GPT
from decode.sampling import SamplingParams
from prune.csr import csr_copy
from runtime.timing import noise_floor, ratio_beside_floor, time_interleaved

GENERATION_PROMPT_TOKENS = 16


@dataclass(frozen=True)
class SpeedSettings:
    batch_size: int = 4
    seq_len: int = 128
    generation_tokens: int = 32
    repeats: int = 5
    # "full": logits at every position, as training and evaluation compute them;
    # "last": logits at the last position only, as a generation prefill does.
    logits: str = "full"


@torch.inference_mode()
def forward_tokens_per_s(models: dict[str, torch.nn.Module], settings: SpeedSettings, device,
                         vocab_size: int) -> dict[str, float]:
    """Median tokens/s of one forward pass over a (batch, seq_len) block of random tokens."""
    generator = torch.Generator().manual_seed(0)
    idx = torch.randint(0, vocab_size, (settings.batch_size, settings.seq_len), generator=generator).to(device)
    last_only = settings.logits == "last"
    times = time_interleaved({name: lambda model=model: model(idx, last_only=last_only)
                              for name, model in models.items()}, settings.repeats, warmup=1, device=device)
    tokens = settings.batch_size * settings.seq_len
    return {name: tokens / statistics.median(t) for name, t in times.items()}


@torch.inference_mode()
def generation_tokens_per_s(models: dict[str, torch.nn.Module], settings: SpeedSettings, device,
                            vocab_size: int) -> dict[str, float]:
    """Median new tokens/s of greedy KV-cache generation from a short random prompt, batch 1, no early stop."""
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, vocab_size, (1, GENERATION_PROMPT_TOKENS), generator=generator).to(device)
    params = SamplingParams(max_new_tokens=settings.generation_tokens, temperature=0, stop_at_eot=False)
    times = time_interleaved({name: lambda model=model: generate(model, prompt, params)
                              for name, model in models.items()}, settings.repeats, warmup=1, device=device)
    return {name: settings.generation_tokens / statistics.median(t) for name, t in times.items()}


def measure(models: dict[str, torch.nn.Module], settings: SpeedSettings, device, vocab_size: int) -> dict[str, dict]:
    forward = forward_tokens_per_s(models, settings, device, vocab_size)
    generation = generation_tokens_per_s(models, settings, device, vocab_size)
    return {name: {"forward_tokens_per_s": forward[name], "generation_tokens_per_s": generation[name]}
            for name in models}


def speed_against_dense(dense: GPT, model: GPT, settings: SpeedSettings, device, with_csr: bool) -> dict:
    """Speed of `model` and of the dense model, interleaved in this run; with `with_csr`, also of a copy of
    `model` whose block weights are stored in sparse CSR format (for masked models)."""
    models = {"dense": dense, "pruned": model}
    if with_csr:
        models["csr"] = csr_copy(model)
    speed = measure(models, settings, device, model.config.vocab_size)
    dense_speed = speed["dense"]
    row = {"forward_tokens_per_s": speed["pruned"]["forward_tokens_per_s"],
           "generation_tokens_per_s": speed["pruned"]["generation_tokens_per_s"],
           "dense_forward_tokens_per_s": dense_speed["forward_tokens_per_s"],
           "dense_generation_tokens_per_s": dense_speed["generation_tokens_per_s"]}
    row["forward_speedup"] = row["forward_tokens_per_s"] / row["dense_forward_tokens_per_s"]
    row["generation_speedup"] = row["generation_tokens_per_s"] / row["dense_generation_tokens_per_s"]
    if "csr" in speed:
        csr = speed["csr"]
        row["csr"] = {**csr, "forward_speedup": csr["forward_tokens_per_s"] / dense_speed["forward_tokens_per_s"],
                      "generation_speedup": csr["generation_tokens_per_s"] / dense_speed["generation_tokens_per_s"]}
    return row


def sparse_format_verdict(rows: list[dict], device: torch.device) -> dict | None:
    """Whether storing the zeros in CSR made the final model faster than dense here (measured, not assumed).

    A speedup counts only beyond the noise floor (`round_noise_floor`).
    """
    last = rows[-1].get("csr")
    if last is None:
        return None
    noise = round_noise_floor(rows)
    forward, generation = last["forward_speedup"], last["generation_speedup"]
    faster = forward > 1 + noise or generation > 1 + noise
    verdict = "a real speedup" if faster else f"no real speedup (noise floor in this run: +-{noise:.0%})"
    return {"format": "torch sparse CSR weights (torch.sparse.mm) in every block linear layer",
            "device": str(device), "forward_speedup": forward, "generation_speedup": generation,
            "noise_floor": noise, "real_speedup": faster,
            "summary": f"CSR at {rows[-1]['sparsity_pruned_tensors']:.1%} sparsity runs forward "
                       f"{ratio_beside_floor(forward, noise)} and generation {ratio_beside_floor(generation, noise)} "
                       f"against the dense model on {device.type}: {verdict}"}


def round_noise_floor(rows: list[dict]) -> float:
    """Round 0 times two copies of the dense model against each other: however far their ratios stray from 1 is
    what chance alone produces in this run (runtime/timing.py's `noise_floor`)."""
    return noise_floor(rows[0]["forward_speedup"], rows[0]["generation_speedup"])
