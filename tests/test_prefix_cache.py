"""Prefix caching (issues 51.3 and 69): a prompt that starts with a recent prompt's tokens reuses their keys and
values, exactly (logits within float tolerance of a full pass, greedy tokens identical, the cache within its
budget); keys are SHA-256 digests chained from a root of the model and the request's salt, so a collision cannot
file a block under a foreign parent and requests with different salts (API keys) never share a block; and the
server caches by default."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from decode import prefix_cache as prefix_cache_module
from decode.prefix_cache import (BLOCK_TOKENS, PrefixCache, block_key, default_budget_bytes, model_identity,
                                 root_key)
from decode.sampling import SamplingParams
from decode.steps import DecodeSteps
from model.config import GPTConfig
from model.gpt import GPT
from serve.app import create_app
from serve.config import API_KEY_ENV, ServeConfig
from serve.engine import Engine
from tests.conftest import save_small_artifact, small_config
from tests.source_tree import python_files
from tests.test_serve_engine import run

VOCAB = 2048
# A block of the small model's: keys and values of 2 layers and the hidden state, 32 floats each a position, fp32.
BLOCK_BYTES = BLOCK_TOKENS * (2 * 2 * 32 + 32) * 4


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(small_config(block_size=128, vocab_size=VOCAB)).eval()


def new_cache(model: GPT, budget: int = 64 << 20) -> PrefixCache:
    return PrefixCache(budget, model_identity(model))


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.inference_mode()
def prefill(model: GPT, cache: PrefixCache, ids: list[int], scored: bool = True, salt: bytes = b""):
    one_row = DecodeSteps(model, torch.device("cpu"), "dynamic").new_cache(1, len(ids))
    return cache.prefill(model, one_row, ids, scored, salt), one_row


@torch.inference_mode()
def full_logits(model: GPT, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids]))[0]


@torch.inference_mode()
def test_reused_keys_values_and_logits_match_a_full_pass(model):
    cache = new_cache(model)
    shared = prompt(2 * BLOCK_TOKENS + 5, 1)
    first, _ = prefill(model, cache, shared)
    assert first.reused_tokens == 0 and len(cache.blocks) == 2
    ids = shared + prompt(20, 2)
    reused, kv = prefill(model, cache, ids)
    assert reused.reused_tokens == 2 * BLOCK_TOKENS
    full = full_logits(model, ids)
    torch.testing.assert_close(reused.logits, full, atol=1e-4, rtol=1e-4)
    alone, kv_alone = prefill(model, new_cache(model, 0), ids)  # a cache with no room computes everything
    assert alone.reused_tokens == 0
    for layer in range(len(kv.k)):
        torch.testing.assert_close(kv.k[layer], kv_alone.k[layer], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(kv.v[layer], kv_alone.v[layer], atol=1e-5, rtol=1e-5)
    last, _ = prefill(model, cache, ids, scored=False)
    torch.testing.assert_close(last.logits, full[:, -1:], atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_a_prompt_of_whole_blocks_still_computes_its_last_token(model):
    cache = new_cache(model)
    ids = prompt(2 * BLOCK_TOKENS, 3)
    prefill(model, cache, ids)
    again, _ = prefill(model, cache, ids)
    assert again.reused_tokens == BLOCK_TOKENS  # the second block holds the last token, whose logits are needed
    torch.testing.assert_close(again.logits, full_logits(model, ids), atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_a_block_is_found_only_behind_the_prefix_it_followed(model):
    cache = new_cache(model)
    a, b = prompt(BLOCK_TOKENS, 4), prompt(BLOCK_TOKENS, 5)
    prefill(model, cache, a + b + [1])
    assert prefill(model, cache, b + b + [1])[0].reused_tokens == 0  # b's block was keyed after a's


@torch.inference_mode()
def test_every_token_of_a_block_is_in_its_key(model):
    """Two prompts that differ only in a block's last (16th) token share nothing, and the second's logits are its
    own: a key that left out any token would hand it the first prompt's keys and values."""
    cache = new_cache(model)
    first = prompt(2 * BLOCK_TOKENS + 3, 6)
    prefill(model, cache, first)
    for position in (0, BLOCK_TOKENS - 1, 2 * BLOCK_TOKENS - 1):
        other = list(first)
        other[position] = (other[position] + 1) % VOCAB
        done, _ = prefill(model, cache, other)
        assert done.reused_tokens == (BLOCK_TOKENS if position >= BLOCK_TOKENS else 0)
        torch.testing.assert_close(done.logits, full_logits(model, other), atol=1e-4, rtol=1e-4)
    tokens = tuple(first[:BLOCK_TOKENS])
    root = root_key(model_identity(model), b"")
    changed = [tokens[:i] + ((tokens[i] + 1) % VOCAB,) + tokens[i + 1:] for i in range(BLOCK_TOKENS)]
    assert len({block_key(root, tokens), *(block_key(root, t) for t in changed)}) == BLOCK_TOKENS + 1


@torch.inference_mode()
def test_keys_are_digests_of_the_model_the_salt_the_parent_and_the_tokens(model):
    identity = model_identity(model)
    tokens = tuple(range(BLOCK_TOKENS))
    root = root_key(identity, b"")
    assert len(block_key(root, tokens)) == 32  # SHA-256
    assert root != root_key(identity, b"salt") != root_key(b"another model", b"salt")
    assert root_key(identity + b"a", b"") != root_key(identity, b"a")  # each part length-prefixed
    assert block_key(root, tokens) != block_key(root_key(identity, b"salt"), tokens)
    assert block_key(root, tokens) == block_key(root_key(identity, b""), tuple(range(BLOCK_TOKENS)))
    other = GPT(small_config(block_size=64, vocab_size=VOCAB))
    assert model_identity(other) != identity


@torch.inference_mode()
def test_requests_with_different_salts_never_share_a_block(model):
    cache = new_cache(model)
    ids = prompt(3 * BLOCK_TOKENS + 2, 7)
    prefill(model, cache, ids, salt=b"alice")
    assert prefill(model, cache, ids, salt=b"bob")[0].reused_tokens == 0
    assert prefill(model, cache, ids)[0].reused_tokens == 0
    assert prefill(model, cache, ids, salt=b"alice")[0].reused_tokens == 3 * BLOCK_TOKENS
    assert prefill(model, cache, ids, salt=b"bob")[0].reused_tokens == 3 * BLOCK_TOKENS  # bob's own, stored above


@torch.inference_mode()
def test_a_collision_on_every_key_never_changes_an_output(model, monkeypatch):
    monkeypatch.setattr(prefix_cache_module, "block_key", lambda parent, tokens: b"\0" * 32)
    cache = new_cache(model)
    a, b, c = (prompt(BLOCK_TOKENS, seed) for seed in (8, 9, 10))
    for ids in (a + b + [1], b + a + [1], a + b + c + [2], a + c + [3], b + b + [4]):
        done, _ = prefill(model, cache, ids)
        torch.testing.assert_close(done.logits, full_logits(model, ids), atol=1e-4, rtol=1e-4)
    assert len(cache.blocks) == 1


@torch.inference_mode()
def test_a_colliding_first_block_files_nothing_under_the_other_prompts_chain(model, monkeypatch):
    """The attack on the 64-bit key: T1 is cached; T2, a different block under T1's key, is sent with a continuation
    X.  The blocks computed after T2 must not be filed as following T1, so that a later T1 + X computes (or finds)
    keys and values that followed T1, not T2."""
    t1, t2, x = prompt(BLOCK_TOKENS, 11), prompt(BLOCK_TOKENS, 12), prompt(2 * BLOCK_TOKENS, 13)
    real = prefix_cache_module.block_key
    monkeypatch.setattr(prefix_cache_module, "block_key",
                        lambda parent, tokens: real(parent, tuple(t1) if tokens == tuple(t2) else tokens))
    cache = new_cache(model)
    prefill(model, cache, t1 + [1])  # T1's block is cached
    attacker, _ = prefill(model, cache, t2 + x + [2])
    assert attacker.reused_tokens == 0
    torch.testing.assert_close(attacker.logits, full_logits(model, t2 + x + [2]), atol=1e-4, rtol=1e-4)
    assert len(cache.blocks) == 1  # nothing stored from the collision on
    victim, _ = prefill(model, cache, t1 + x + [3])
    assert victim.reused_tokens == BLOCK_TOKENS  # T1 alone: X after T1 was never computed before
    torch.testing.assert_close(victim.logits, full_logits(model, t1 + x + [3]), atol=1e-4, rtol=1e-4)
    again, _ = prefill(model, cache, t1 + x + [3])
    assert again.reused_tokens == 3 * BLOCK_TOKENS
    torch.testing.assert_close(again.logits, full_logits(model, t1 + x + [3]), atol=1e-4, rtol=1e-4)


@torch.inference_mode()
@pytest.mark.parametrize("first, second", [(b"salt a", b"salt b"), (b"salt b", b"salt a")])
def test_a_block_held_under_its_key_behind_another_parent_is_neither_reused_nor_built_on(model, monkeypatch, first,
                                                                                         second):
    """Keys that leave out the parent (a collision across salts, in either order of their root digests): the block
    one salt cached is not reused under the other, and nothing the other computes after it is filed behind it."""
    real = prefix_cache_module.block_key
    monkeypatch.setattr(prefix_cache_module, "block_key", lambda parent, tokens: real(b"", tokens))
    head, tail, other = (prompt(BLOCK_TOKENS, seed) for seed in (25, 26, 27))
    cache = new_cache(model)
    prefill(model, cache, head + tail + [1], salt=first)
    assert prefill(model, cache, head + other + [2], salt=second)[0].reused_tokens == 0
    assert [block.tokens for block in cache.blocks.values()] == [tuple(head), tuple(tail)]


@torch.inference_mode()
@pytest.mark.parametrize("seeds", [(28, 29), (29, 28)])
def test_a_block_held_under_its_key_with_other_tokens_stops_the_store(model, monkeypatch, seeds):
    """Keys that leave out the tokens (a collision of two first blocks, in either order of their tokens): the
    second prompt's blocks after the colliding one are not filed behind a block they did not follow."""
    real = prefix_cache_module.block_key
    monkeypatch.setattr(prefix_cache_module, "block_key", lambda parent, tokens: real(parent, ()))
    held, sent = (prompt(BLOCK_TOKENS, seed) for seed in seeds)
    cache = new_cache(model)
    prefill(model, cache, held + [1])
    assert prefill(model, cache, sent + prompt(BLOCK_TOKENS, 30) + [2])[0].reused_tokens == 0
    assert [block.tokens for block in cache.blocks.values()] == [tuple(held)]


@torch.inference_mode()
def test_blocks_stored_after_a_reused_prefix_follow_its_last_block(model):
    head, more = prompt(2 * BLOCK_TOKENS, 31), prompt(BLOCK_TOKENS, 32)
    cache = new_cache(model)
    prefill(model, cache, head + [1])
    assert prefill(model, cache, head + more + [2])[0].reused_tokens == 2 * BLOCK_TOKENS
    assert prefill(model, cache, head + more + [3])[0].reused_tokens == 3 * BLOCK_TOKENS


@torch.inference_mode()
def test_a_prompts_full_blocks_are_stored_with_their_exact_bytes_and_a_budget_of_one_block_holds_one(model):
    """A block's bytes are its keys, values and hidden states: 16 positions of (2 layers x keys and values + the
    hidden state) x 32 floats for the small model.  Only full blocks are stored; a budget of exactly one block holds
    it, and one byte less holds none."""
    for length, blocks in ((BLOCK_TOKENS - 1, 0), (2 * BLOCK_TOKENS - 1, 1), (2 * BLOCK_TOKENS, 2),
                           (2 * BLOCK_TOKENS + 1, 2)):
        cache = new_cache(model)
        prefill(model, cache, prompt(length, 33))
        assert (len(cache.blocks), cache.nbytes) == (blocks, blocks * BLOCK_BYTES), length
    for budget, blocks in ((BLOCK_BYTES, 1), (BLOCK_BYTES - 1, 0)):
        cache = new_cache(model, budget)
        prefill(model, cache, prompt(2 * BLOCK_TOKENS + 1, 34))
        assert (len(cache.blocks), cache.nbytes) == (blocks, blocks * BLOCK_BYTES), budget


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_reuse_changes_no_logit_over_prompts_that_share_prefixes(model, data):
    """Random prompts drawn from a few shared heads (whole blocks or not) and tails, over a tiny alphabet so that
    blocks repeat at other positions and behind other parents: every prompt's logits, cache on, are a full pass's."""
    cache = new_cache(model, data.draw(st.sampled_from([64 << 20, 5 * BLOCK_BYTES])))  # roomy, or evicting
    tokens = st.lists(st.integers(0, 3), min_size=1, max_size=2 * BLOCK_TOKENS + 3)
    heads = data.draw(st.lists(tokens, min_size=1, max_size=3))
    for _ in range(data.draw(st.integers(2, 5))):
        ids = (data.draw(st.sampled_from(heads)) + data.draw(tokens))[:120]
        scored = data.draw(st.booleans())
        done, _ = prefill(model, cache, ids, scored=scored)
        full = full_logits(model, ids)
        torch.testing.assert_close(done.logits, full if scored else full[:, -1:], atol=1e-4, rtol=1e-4)
        assert cache.nbytes <= cache.budget_bytes


@torch.inference_mode()
def test_the_budget_holds_and_the_least_recently_used_blocks_leave_first(model):
    cache = new_cache(model, 3 * BLOCK_BYTES)
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


def test_the_default_budget_holds_two_contexts_of_the_models_blocks():
    config = small_config(block_size=128)
    per_position = 2 * config.n_layer * config.n_embd * 4 + config.n_embd * 4  # keys, values and hidden, fp32
    assert default_budget_bytes(config) == 2 * 128 * per_position
    odd = small_config(n_layer=1, n_embd=48, block_size=64)  # 2 x 48 and 48 share bits: a sum, not an or
    assert default_budget_bytes(odd) == 2 * 64 * (2 * 48 + 48) * 4 and type(default_budget_bytes(odd)) is int
    assert default_budget_bytes(GPTConfig()) == 150 * 2**20  # GPT-2 124M's shape


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


def metric(client: TestClient, name: str, headers: dict | None = None) -> float:
    text = client.get("/metrics", headers=headers or {}).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(f"{name} ")))


def test_scoring_reuses_the_context_by_default_and_metrics_count_it(tmp_path):
    """The evaluation harness's shape: one context, several continuations, echo + logprobs + max_tokens 0; the
    server's default caches (no flag), and --prefix-cache-mb 0 turns it off with the same log-probabilities."""
    checkpoint = save_small_artifact(tmp_path / "artifact", block_size=128)
    context, continuations = prompt(40, 12), [prompt(6, 30 + i) for i in range(4)]
    replies = []
    for megabytes in (0, None):
        config = ServeConfig(checkpoint=checkpoint, device="cpu", warm_up="one-row", prefix_cache_mb=megabytes)
        with TestClient(create_app(config)) as client:
            body = {"model": Path(checkpoint).name, "echo": True, "logprobs": 1, "max_tokens": 0}
            replies.append([client.post("/v1/completions", json={**body, "prompt": context + c}).json()
                            ["choices"][0]["logprobs"]["token_logprobs"] for c in continuations])
            # With the cache, the first request computes the context and the three after it reuse its two blocks.
            hits, reused = (3, 3 * 2 * BLOCK_TOKENS) if megabytes is None else (0, 0)
            assert metric(client, "serve_prefix_cache_hits_total") == hits
            assert metric(client, "serve_prefix_cache_reused_tokens_total") == reused
    for off, on in zip(*replies):
        assert off[0] is None and on[0] is None
        assert on[1:] == pytest.approx(off[1:], abs=1e-4)


def test_a_repeated_100_token_prefix_is_reused_with_no_flag(tmp_path):
    checkpoint = save_small_artifact(tmp_path / "artifact", block_size=256)
    head = prompt(100, 40)
    with TestClient(create_app(ServeConfig(checkpoint=checkpoint, device="cpu", warm_up="one-row"))) as client:
        for tail in (prompt(5, 41), prompt(7, 42)):
            body = {"model": Path(checkpoint).name, "prompt": head + tail, "max_tokens": 2, "temperature": 0}
            assert client.post("/v1/completions", json=body).status_code == 200
        assert metric(client, "serve_prefix_cache_reused_tokens_total") == 96  # six whole blocks of the 100


def test_clients_with_different_api_keys_or_salts_never_share_blocks(tmp_path, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "key-of-alice,key-of-bob")
    checkpoint = save_small_artifact(tmp_path / "artifact", block_size=128)
    alice, bob = ({"Authorization": f"Bearer key-of-{name}"} for name in ("alice", "bob"))
    secret = {"model": Path(checkpoint).name, "prompt": prompt(2 * BLOCK_TOKENS + 4, 50), "max_tokens": 1,
              "temperature": 0}
    reused = lambda: metric(client, "serve_prefix_cache_reused_tokens_total", alice)
    with TestClient(create_app(ServeConfig(checkpoint=checkpoint, device="cpu", warm_up="one-row"))) as client:
        assert client.get("/metrics").status_code == 401  # its counters would say what other clients sent
        assert client.post("/v1/completions", json=secret, headers=alice).status_code == 200
        assert client.post("/v1/completions", json=secret, headers=bob).status_code == 200
        assert reused() == 0  # bob's guess of alice's prompt reused nothing
        assert client.post("/v1/completions", json={**secret, "cache_salt": "s"}, headers=alice).status_code == 200
        assert reused() == 0  # a salt of her own keeps even alice's requests apart
        assert client.post("/v1/completions", json=secret, headers=alice).status_code == 200
        assert reused() == 2 * BLOCK_TOKENS
        generate = {"prompt": "x", "max_new_tokens": 1, "cache_salt": "s"}
        assert client.post("/generate", json=generate, headers=bob).status_code == 200


def test_requests_without_a_key_share_only_with_the_same_cache_salt(tmp_path):
    checkpoint = save_small_artifact(tmp_path / "artifact", block_size=128)
    body = {"model": Path(checkpoint).name, "prompt": prompt(BLOCK_TOKENS + 4, 51), "max_tokens": 1,
            "temperature": 0}
    with TestClient(create_app(ServeConfig(checkpoint=checkpoint, device="cpu", warm_up="one-row"))) as client:
        for salt, reused in (("a", 0), ("b", 0), (None, 0), ("a", BLOCK_TOKENS), (None, 2 * BLOCK_TOKENS)):
            sent = body if salt is None else {**body, "cache_salt": salt}
            assert client.post("/v1/completions", json=sent).status_code == 200
            assert metric(client, "serve_prefix_cache_reused_tokens_total") == reused


# serve/ asks the prefix cache (decode/) and the KV cache (model/) for reuse and rows; it never touches a cache's
# tensors, which the cache layer owns.
CACHE_TENSORS = {"k", "v"}


def cache_tensor_uses(source: str) -> list[int]:
    """Lines of `source` that reach a KV cache's tensors (an attribute `k` or `v`), to read or to write them."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr in CACHE_TENSORS]


def test_the_check_finds_a_cache_tensor_write():
    assert cache_tensor_uses("cache.k[layer][0, :, columns] = k\nx = cache.lengths\n") == [1]
    assert cache_tensor_uses("for t in cache.v:\n    t.zero_()\n") == [1]


def test_serve_writes_no_cache_tensor():
    found = {str(path): lines for path in python_files("serve") for lines in [cache_tensor_uses(path.read_text())]
             if lines}
    assert found == {}, "serve/ reaches a KV cache's tensors; ask model/kv_cache.py or decode/prefix_cache.py instead"


def test_the_pair_that_collided_under_the_old_key_changes_no_other_requests_output(tmp_path):
    """The 5-token heads whose 16-token blocks (each followed by the same 11 tokens) had equal 64-bit keys under
    Python's hash(): sent as token ids in the attack's order, the victim's greedy text and echo log-probabilities
    are those of a server without the cache."""
    tail = [464, 3290, 286, 262, 995, 318, 257, 1332, 13, 198, 1870]
    t1, t2 = [20008, 1495, 45671, 37560, 1] + tail, [20057, 35761, 699, 32680, 2] + tail
    after = prompt(2 * BLOCK_TOKENS, 60)
    checkpoint = save_small_artifact(tmp_path / "artifact", block_size=128, vocab_size=50257)
    replies = []
    for megabytes in (0, None):
        config = ServeConfig(checkpoint=checkpoint, device="cpu", warm_up="one-row", prefix_cache_mb=megabytes)
        with TestClient(create_app(config)) as client:
            send = lambda ids, **more: client.post("/v1/completions", json={
                "model": Path(checkpoint).name, "prompt": ids, "max_tokens": 8, "temperature": 0, "echo": True,
                "logprobs": 1, **more}).json()["choices"][0]
            send(t1 + [5])  # the victim's block is cached
            send(t2 + after + [6])  # the attacker's colliding block, then what follows it
            victim = send(t1 + after + [7])
            replies.append((victim["text"], victim["logprobs"]["token_logprobs"][1:]))
    assert replies[0][0] == replies[1][0]
    assert replies[1][1] == pytest.approx(replies[0][1], abs=1e-4)
