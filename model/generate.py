"""Autoregressive sampling with a KV cache: temperature, top-k, top-p, seed, stop at end-of-text."""
from __future__ import annotations

import torch

from model.config import EOT_TOKEN
from model.gpt import GPT, ContextOverflow, KVCache
from model.sampling import SamplingParams, row_generators, sample_rows


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
        raise ContextOverflow(f"prompt of {T} tokens + {params.max_new_tokens} new tokens exceeds the "
                         f"model's context of {block_size}")
    generators = row_generators(params.seed, B, idx.device)
    dtype = next(model.parameters()).dtype
    dtype = dtype if dtype.is_floating_point else torch.float32
    cache = KVCache(model.config, B, T + params.max_new_tokens, idx.device, dtype) if use_cache else None
    done = torch.zeros(B, dtype=torch.bool, device=idx.device)
    out = idx
    step_input = idx
    for _ in range(params.max_new_tokens):
        logits, _ = model(step_input if use_cache else out, cache=cache, last_only=True)
        token = torch.tensor(sample_rows(logits[:, -1], [params] * B, generators), device=idx.device)
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
