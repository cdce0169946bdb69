"""Autoregressive sampling with a KV cache: temperature, top-k, top-p, seed, stop at end-of-text."""
from __future__ import annotations

import torch

from model.config import EOT_TOKEN
from model.decode_graph import CudaGraphDecoder
from model.decode_trace import TracedDecoder, TracedSteps
from model.gpt import GPT, ContextOverflow, KVCache, StaticKVCache
from model.sampling import SamplingParams, row_generators, sample_rows
from model.speculative import DEFAULT_DRAFT_TOKENS, SpeculativeStats, cache_dtype, speculative_generate

# auto: the fastest for the device (fastest_decode); dynamic: the cache's keys grow with the sequence (the fastest
# eager steps); static: fixed shapes, attention over every slot with a mask (what a CUDA graph needs); cuda-graph:
# static, each decode step replayed as one captured CUDA graph (model/decode_graph.py); traced: dynamic, each
# decode step one traced TorchScript graph, without Python between its operators (model/decode_trace.py).
DECODE_MODES = ("auto", "dynamic", "static", "cuda-graph", "traced")


def fastest_decode(model: torch.nn.Module, device: torch.device) -> str:
    """What `auto` runs for `model` on `device`.  CPU: the traced steps, whose graph multiplies through
    oneDNN-packed weights, the fastest path measured there (`python -m bench.experiments generate_speed`).  CUDA:
    one captured graph per step, which a probe on an H100 ran at 3.7x eager steps at batch 1
    (shared/device/README.md) and tests/test_cuda.py checks token for token; the traced steps are not tested on
    CUDA, so they are not chosen there.  Eager steps elsewhere, in a process group of several ranks (a sharded
    model's collectives can be neither traced nor captured), and for a model with a layer that says the tracer
    cannot record it (`traceable = False`, as prune/csr.py's sparse products do)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1:
        return "dynamic"
    if not all(getattr(m, "traceable", True) for m in model.modules()):
        return "dynamic"
    return {"cpu": "traced", "cuda": "cuda-graph"}.get(device.type, "dynamic")


def speculative_traced_steps(model: torch.nn.Module, device: torch.device, decode: str,
                             max_rows: int) -> TracedSteps | None:
    """Under `auto`, a speculative target's or draft's passes of a few tokens run traced where its plain decoding
    would be (model/speculative.py); None: eager passes.  Up to `max_rows` rows decode together: a trace is kept
    for each row count (rows leave as they finish), each of two widths (the draft's one or two tokens, the
    target's K + 1 or fewer near the end of its context) and each placement (rows aligned or not)."""
    traced = decode == "auto" and fastest_decode(model, device) == "traced"
    return TracedSteps(model, kept=4 * max_rows) if traced else None


@torch.inference_mode()
def generate(model: GPT, idx: torch.Tensor, params: SamplingParams, use_cache: bool = True,
             on_token=None, decode: str = "auto", draft: GPT | None = None,
             draft_tokens: int = DEFAULT_DRAFT_TOKENS, stats: SpeculativeStats | None = None) -> torch.Tensor:
    """Extend the prompts `idx` (B, T) by up to `params.max_new_tokens` tokens.

    Rows that emit end-of-text stop growing (later positions are filled with
    end-of-text); generation ends early when every row has stopped.  `on_token`
    is called with each new column of tokens, for streaming and timing.
    `decode` picks how the cached steps run (DECODE_MODES); the tokens are the same.  The model is not changed:
    the traced steps hold their own oneDNN-packed copies of its float32 weights.

    With a `draft` model, decoding is speculative (model/speculative.py): the draft proposes `draft_tokens` tokens
    per step and the model checks them in one pass; greedy tokens are the model's own, sampled ones follow the
    model's distribution.  `stats`, a SpeculativeStats, is then filled with the acceptance counts.
    """
    model.eval()
    B, T = idx.shape
    block_size = model.config.block_size
    if T + params.max_new_tokens > block_size:
        raise ContextOverflow(f"prompt of {T} tokens + {params.max_new_tokens} new tokens exceeds the "
                         f"model's context of {block_size}")
    if decode not in DECODE_MODES:
        raise ValueError(f"decode {decode!r} is not one of {DECODE_MODES}")
    if draft is not None:
        if decode not in ("auto", "dynamic") or not use_cache:
            raise ValueError(f"speculative decoding (a draft model) runs its own passes with the KV cache (traced "
                             f"under 'auto' where the rows allow, eager under 'dynamic'); use decode 'auto' or "
                             f"'dynamic' (got {decode!r}) and use_cache=True")
        return speculative_generate(model, draft, idx, params, draft_tokens, on_token, stats,
                                    speculative_traced_steps(model, idx.device, decode, B),
                                    speculative_traced_steps(draft, idx.device, decode, B))
    if decode == "auto":
        decode = fastest_decode(model, idx.device)
    if decode == "cuda-graph" and idx.device.type != "cuda":
        raise ValueError(f"decode 'cuda-graph' needs a CUDA device; the model is on {idx.device}")
    generators = row_generators(params.seed, B, idx.device)
    dtype = cache_dtype(model)
    cache, step = None, None
    if use_cache:
        cache_type = StaticKVCache if decode in ("static", "cuda-graph") else KVCache
        cache = cache_type(model.config, B, T + params.max_new_tokens, idx.device, dtype)
        if decode == "cuda-graph":
            step = CudaGraphDecoder(model, cache)
        elif decode == "traced":
            step = TracedDecoder(model, cache)
    done = torch.zeros(B, dtype=torch.bool, device=idx.device)
    out = idx
    step_input = idx
    for i in range(params.max_new_tokens):
        if step is not None and i > 0:
            logits = step(step_input)
        else:
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
