"""The prompt passes of requests joining the running batch (serve/runner.py's `join_together`): which requests
prefill together, and the pass itself, through the prefix cache when there is one.

Requests that arrive together with prompts of one length prefill in one pass: one product over all their tokens,
not one per prompt, as generate() prefills its rows; a product of many rows uses the cores better than many of one
row (`python -m bench.standalone.joining_batch` times both, bench/results/joining_batch.json).  With the prefix
cache, the rows of one pass reuse cached prefixes of one length (decode/prefix_cache.py's `prefill_rows`), so they
are grouped by that too.
"""
from __future__ import annotations

import torch

from decode.prefix_cache import PrefixCache
from decode.steps import DecodeSteps
from model.kv_cache import KVCache
from serve.events import GenerationRequest
from serve.metrics import ServerMetrics


def prefill_groups(requests: list[GenerationRequest], prefix_cache: PrefixCache | None,
                   one_at_a_time: bool = False) -> list[list[GenerationRequest]]:
    """The requests joining at once, grouped in order of arrival: those with prompts of one length (and, with the
    `prefix_cache`, cached prefixes as long) in one group.  A prompt that is scored (echo with log-probabilities)
    prefills alone, and so does every prompt `one_at_a_time` (a runner with a draft model)."""
    groups: dict[object, list[GenerationRequest]] = {}
    for i, request in enumerate(requests):
        if one_at_a_time or request.echo and request.logprobs is not None:
            key: object = i  # a group of its own
        elif prefix_cache is not None:
            key = (len(request.prompt_ids), prefix_cache.reused_tokens(request.prompt_ids, request.cache_salt))
        else:
            key = len(request.prompt_ids)
        groups.setdefault(key, []).append(request)
    return list(groups.values())


def prefill(steps: DecodeSteps, prefix_cache: PrefixCache | None, metrics: ServerMetrics, cache: KVCache,
            requests: list[GenerationRequest], prompt: torch.Tensor, scored: bool) -> torch.Tensor:
    """The pass of `prompt`, the requests' prompts (a row each, one length), into `cache`: their logits, every
    position's when `scored`, else the last one's; through the prefix cache when there is one, among the blocks of
    requests with the same cache salt."""
    if prefix_cache is None:
        return steps.logits(cache, prompt, prompt.size(1) if scored else 1)
    done = prefix_cache.prefill_rows(steps.model, cache, [r.prompt_ids for r in requests], scored,
                                     [r.cache_salt for r in requests])
    if done.reused_tokens:
        metrics.prefix_hits.inc(len(requests))
        metrics.prefix_reused_tokens.inc(done.reused_tokens * len(requests))
    metrics.prefix_cache_bytes.set(prefix_cache.nbytes)
    return done.logits
