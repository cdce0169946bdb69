"""Measured (never projected) forward and generation throughput of several models, interleaved.

The models are timed in turns within each repeat (runtime/timing.py), so a change in machine load
hits all of them alike; each figure is the median over the repeats after one warm-up round.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from model.generate import generate
from model.sampling import SamplingParams
from runtime.timing import time_interleaved

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
