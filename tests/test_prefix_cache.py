"""Prefix caching (issue 51.3): a prompt that starts with a recent prompt's tokens reuses their keys and values,
exactly: logits within float tolerance of a full pass, greedy tokens identical, and the cache within its budget."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from decode.sampling import SamplingParams
from decode.steps import DecodeSteps
from model.gpt import GPT
from serve.app import create_app
from serve.config import ServeConfig
from serve.engine import Engine
from serve.prefix_cache import BLOCK_TOKENS, PrefixCache
from tests.conftest import save_small_artifact, small_config
from tests.test_serve_engine import run

VOCAB = 2048


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(small_config(block_size=128, vocab_size=VOCAB)).eval()


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.inference_mode()
def prefill(model: GPT, cache: PrefixCache, ids: list[int], scored: bool = True):
    one_row = DecodeSteps(model, torch.device("cpu"), "dynamic").new_cache(1, len(ids))
    return cache.prefill(model, one_row, ids, scored), one_row


@torch.inference_mode()
def test_reused_keys_values_and_logits_match_a_full_pass(model):
    cache = PrefixCache(64 << 20)
    shared = prompt(2 * BLOCK_TOKENS + 5, 1)
    first, _ = prefill(model, cache, shared)
    assert first.reused_tokens == 0 and len(cache.blocks) == 2
    ids = shared + prompt(20, 2)
    reused, kv = prefill(model, cache, ids)
    assert reused.reused_tokens == 2 * BLOCK_TOKENS
    full = model(torch.tensor([ids]))[0]
    torch.testing.assert_close(reused.logits, full, atol=1e-4, rtol=1e-4)
    alone, kv_alone = prefill(model, PrefixCache(0), ids)  # a cache with no room computes everything
    assert alone.reused_tokens == 0
    for layer in range(len(kv.k)):
        torch.testing.assert_close(kv.k[layer], kv_alone.k[layer], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(kv.v[layer], kv_alone.v[layer], atol=1e-5, rtol=1e-5)
    last, _ = prefill(model, cache, ids, scored=False)
    torch.testing.assert_close(last.logits, full[:, -1:], atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_a_prompt_of_whole_blocks_still_computes_its_last_token(model):
    cache = PrefixCache(64 << 20)
    ids = prompt(2 * BLOCK_TOKENS, 3)
    prefill(model, cache, ids)
    again, _ = prefill(model, cache, ids)
    assert again.reused_tokens == BLOCK_TOKENS  # the second block holds the last token, whose logits are needed
    torch.testing.assert_close(again.logits, model(torch.tensor([ids]))[0], atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_a_block_is_found_only_behind_the_prefix_it_followed(model, monkeypatch):
    cache = PrefixCache(64 << 20)
    a, b = prompt(BLOCK_TOKENS, 4), prompt(BLOCK_TOKENS, 5)
    prefill(model, cache, a + b + [1])
    assert prefill(model, cache, b + b + [1])[0].reused_tokens == 0  # b's block was keyed after a's
    # Every key colliding: the stored tokens and parent are compared, so nothing wrong is reused.
    monkeypatch.setattr("serve.prefix_cache.block_key", lambda parent, tokens: 0)
    colliding = PrefixCache(64 << 20)
    prefill(model, colliding, a + [1])
    done, _ = prefill(model, colliding, b + [1])
    assert done.reused_tokens == 0
    torch.testing.assert_close(done.logits, model(torch.tensor([b + [1]]))[0], atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_the_budget_holds_and_the_least_recently_used_blocks_leave_first(model):
    probe = PrefixCache(64 << 20)
    prefill(model, probe, prompt(BLOCK_TOKENS + 1, 6))
    block_bytes = probe.nbytes
    cache = PrefixCache(3 * block_bytes)
    a, b = (prompt(2 * BLOCK_TOKENS + 1, seed) for seed in (7, 8))
    blocks_of = lambda ids: [tuple(ids[:BLOCK_TOKENS]), tuple(ids[BLOCK_TOKENS:2 * BLOCK_TOKENS])]
    prefill(model, cache, a)
    prefill(model, cache, b)  # 4 blocks' worth: a's first block, the least recently used, leaves
    assert [block.tokens for block in cache.blocks.values()] == blocks_of(a)[1:] + blocks_of(b)
    assert cache.nbytes <= cache.budget_bytes
    assert prefill(model, cache, b)[0].reused_tokens == 2 * BLOCK_TOKENS
    # A prompt longer than the budget never evicts its own blocks: it keeps the first ones that fit.
    long = prompt(5 * BLOCK_TOKENS + 1, 10)
    prefill(model, cache, long)
    assert [block.tokens for block in cache.blocks.values()] == [tuple(long[i:i + BLOCK_TOKENS])
                                                                 for i in range(0, 3 * BLOCK_TOKENS, BLOCK_TOKENS)]
    assert prefill(model, cache, long)[0].reused_tokens == 3 * BLOCK_TOKENS


def test_greedy_tokens_are_identical_with_and_without_reuse(model):
    shared = prompt(3 * BLOCK_TOKENS + 3, 11)
    jobs = [(shared + prompt(n, 20 + n), SamplingParams(max_new_tokens=12, temperature=0, stop_at_eot=False))
            for n in (1, 5, 9, 17)]
    outputs = []
    for budget in (0, 64 << 20):
        engine = Engine(model, torch.device("cpu"), max_batch_size=4, max_queue=8, request_timeout_s=60,
                        prefix_cache_bytes=budget)
        engine.start()
        try:
            outputs.append([run(engine, [job]).tokens[0] for job in jobs] + run(engine, jobs).tokens)
        finally:
            engine.stop()
        assert budget == 0 or engine.metrics.prefix_reused_tokens.values
    assert outputs[0] == outputs[1]


def test_scoring_reuses_the_context_and_metrics_count_it(tmp_path):
    """The evaluation harness's shape: one context, several continuations, echo + logprobs + max_tokens 0."""
    checkpoint = save_small_artifact(tmp_path / "artifact", block_size=128)
    context, continuations = prompt(40, 12), [prompt(6, 30 + i) for i in range(4)]
    replies = []
    for megabytes in (0, 64):
        config = ServeConfig(checkpoint=checkpoint, device="cpu", warm_up="one-row", prefix_cache_mb=megabytes)
        with TestClient(create_app(config)) as client:
            body = {"model": Path(checkpoint).name, "echo": True, "logprobs": 1, "max_tokens": 0}
            replies.append([client.post("/v1/completions", json={**body, "prompt": context + c}).json()
                            ["choices"][0]["logprobs"]["token_logprobs"] for c in continuations])
            metrics = client.get("/metrics").text
        # With the cache, the first request computes the context and the three after it reuse its two blocks.
        hits, reused = (3, 3 * 2 * BLOCK_TOKENS) if megabytes else (0, 0)
        assert f"\nserve_prefix_cache_hits_total {hits}\n" in metrics
        assert f"\nserve_prefix_cache_reused_tokens_total {reused}\n" in metrics
    for off, on in zip(*replies):
        assert off[0] is None and on[0] is None
        assert on[1:] == pytest.approx(off[1:], abs=1e-4)
