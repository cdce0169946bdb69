"""Autoregressive sampling with a KV cache: temperature, top-k, top-p, seed, stop at end-of-text."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from model.config import EOT_TOKEN
from model.gpt import GPT, KVCache


@dataclass
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0 means greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_at_eot: bool = True


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Scale by temperature and mask what top-k / nucleus sampling excludes (rows are sequences)."""
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token once the mass before it already reaches top_p; the best token always stays.
        drop_sorted = cumulative - sorted_logits.softmax(-1) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """One token id per row of `logits` (B, vocab)."""
    if params.temperature == 0:
        return logits.argmax(-1)
    probs = filter_logits(logits.float(), params.temperature, params.top_k, params.top_p).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.inference_mode()
def generate(model: GPT, idx: torch.Tensor, params: SamplingParams, use_cache: bool = True,
             on_token=None) -> torch.Tensor:
    """Extend the prompts `idx` (B, T) by up to `params.max_new_tokens` tokens.

    Rows that emit end-of-text stop growing (later positions are filled with
    end-of-text); generation ends early when every row has stopped.  `on_token`
    is called with each new column of tokens, for streaming and timing.
    """
    model.eval()
    B, T = idx.shape
    block_size = model.config.block_size
    if T + params.max_new_tokens > block_size:
        raise ValueError(f"prompt of {T} tokens + {params.max_new_tokens} new tokens exceeds the "
                         f"model's context of {block_size}")
    generator = None
    if params.seed is not None:
        generator = torch.Generator(device=idx.device).manual_seed(params.seed)
    dtype = next(model.parameters()).dtype
    dtype = dtype if dtype.is_floating_point else torch.float32
    cache = KVCache(model.config, B, T + params.max_new_tokens, idx.device, dtype) if use_cache else None
    done = torch.zeros(B, dtype=torch.bool, device=idx.device)
    out = idx
    step_input = idx
    for _ in range(params.max_new_tokens):
        logits, _ = model(step_input if use_cache else out, cache=cache, last_only=True)
        token = sample_next(logits[:, -1], params, generator)
        token = torch.where(done, torch.full_like(token, EOT_TOKEN), token)
        out = torch.cat([out, token[:, None]], dim=1)
        if on_token is not None:
            on_token(token)
        if params.stop_at_eot:
            done |= token == EOT_TOKEN
            if bool(done.all()):
                break
        step_input = token[:, None]
    return out
