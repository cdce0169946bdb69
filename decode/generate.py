"""Autoregressive sampling with a KV cache: temperature, top-k, top-p, seed; rows end as decode/row_state.py says."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from model.config import EOT_TOKEN
from decode.steps import DecodeSteps
from model.gpt import GPT
from model.kv_cache import ContextOverflow
from decode.row_state import RowState
from decode.sampling import SamplingError, SamplingParams, row_generators, sample_rows
from decode.speculative import DEFAULT_DRAFT_TOKENS, SpeculativeStats, speculative_generate


@dataclass
class CallTiming:
    """The one-time set-up inside a generate() call (traces of decode steps, with their first runs), which a
    decode rate should leave out: in all, and before the first new tokens (speculative decoding traces the draft's
    steps before its first tokens come; plain decoding traces after them)."""
    setup_s: float = 0.0
    setup_before_first_token_s: float = 0.0

    def watch(self, on_token, steps: list[DecodeSteps]):
        """`on_token`, also noting the set-up spent before the first tokens."""
        first = []

        def noted(token):
            if not first:
                first.append(True)
                self.setup_before_first_token_s = sum(s.setup_s for s in steps)
            if on_token is not None:
                on_token(token)
        return noted


@torch.inference_mode()
def generate(model: GPT, idx: torch.Tensor, params: SamplingParams, use_cache: bool = True,
             on_token=None, decode: str = "auto", draft: GPT | None = None,
             draft_tokens: int = DEFAULT_DRAFT_TOKENS, stats: SpeculativeStats | None = None,
             timing: CallTiming | None = None, rows: list[RowState] | None = None) -> torch.Tensor:
    """Extend the prompts `idx` (B, T) by up to `params.max_new_tokens` tokens.

    A row that ends (decode/row_state.py: at end-of-text, or at a stop string of its RowState) stops growing: its
    later positions are filled with end-of-text, and generation ends early when every row has ended.  `rows`, one
    RowState per row, are the rows' states to read afterwards (their tokens, text and finish reason); by default
    plain ones with `params`.  `on_token` is called with each new column of tokens, for streaming and timing.
    `decode` picks how the cached steps run (decode/steps.py's DECODE_MODES); the tokens are the same.  The
    model is not changed: the traced steps hold their own oneDNN-packed copies of its float32 weights.

    With a `draft` model, decoding is speculative (decode/speculative.py): the draft proposes `draft_tokens` tokens
    per step and the model checks them in one pass; greedy tokens are the model's own, sampled ones follow the
    model's distribution.  `stats`, a SpeculativeStats, is then filled with the acceptance counts.

    `timing`, a CallTiming, is filled with the call's one-time set-up, which a decode rate should leave out.
    """
    model.eval()
    B, T = idx.shape
    rows = rows if rows is not None else [RowState(params) for _ in range(B)]
    if len(rows) != B:
        raise ValueError(f"{len(rows)} row states for {B} rows")
    block_size = model.config.block_size
    if T + params.max_new_tokens > block_size:
        raise ContextOverflow(f"prompt of {T} tokens + {params.max_new_tokens} new tokens exceeds the "
                         f"model's context of {block_size}")
    if draft is not None:
        if params.adjusts_logits:  # the draft's proposals are checked against the unadjusted distribution
            raise SamplingError("logit_bias and the penalties are not available with speculative decoding (a draft "
                                "model); leave them out, or decode without the draft")
        if not use_cache:
            raise ValueError("speculative decoding (a draft model) runs its passes with the KV cache; use_cache=True")
        used = [DecodeSteps(m, idx.device, decode, B, speculative=True) for m in (model, draft)]
    else:
        used = [DecodeSteps(model, idx.device, decode, B)]
    if timing is not None:
        on_token = timing.watch(on_token, used)
    try:
        if draft is not None:
            out = speculative_generate(*used, idx, params, draft_tokens, on_token, stats, rows)
        else:
            out = _plain_generate(model, used[0], idx, params, use_cache, on_token, rows)
    finally:
        for steps in used:
            steps.release_threads()
    if timing is not None:
        timing.setup_s = sum(steps.setup_s for steps in used)
    return out


def _plain_generate(model: GPT, steps: DecodeSteps, idx: torch.Tensor, params: SamplingParams, use_cache: bool,
                    on_token, rows: list[RowState]) -> torch.Tensor:
    B, T = idx.shape
    generators = row_generators(params.seed, B, idx.device)
    cache = steps.new_cache(B, T + params.max_new_tokens) if use_cache else None
    out = idx
    step_input = idx
    for made in range(params.max_new_tokens):
        if use_cache:
            logits = steps.logits(cache, step_input, 1, tokens_left=params.max_new_tokens - made)
        else:
            logits, _ = model(out, last_only=True)
        column = []
        for row, token in zip(rows, sample_rows(logits[:, -1], [params] * B, generators, [r.tokens for r in rows])):
            if row.finished:
                token = EOT_TOKEN
            else:
                row.accept(token)
            column.append(token)
        token = torch.tensor(column, device=idx.device)
        out = torch.cat([out, token[:, None]], dim=1)
        if on_token is not None:
            on_token(token)
        if all(row.finished for row in rows):
            break
        step_input = token[:, None]
    return out
