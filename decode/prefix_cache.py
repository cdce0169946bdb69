"""Prefix caching: a prompt that starts with the tokens of a recent prompt reuses their keys and values instead of
computing them again (an evaluation harness scores one context once per continuation; few-shot prompts share
their examples).  It lives beside the KV cache, as vLLM's block manager holds it: the engine asks `prefill` for a
prompt's pass and gets its logits; the KV cache's own methods copy blocks out of a prefilled row and into a new one.

Prompts are cut into blocks of BLOCK_TOKENS tokens.  A block's key is a SHA-256 digest chained from the first
block, as vLLM keys them since CVE-2025-25183: over its parent's key and its own tokens, where the first block's
parent is a root digest of the model's identity and the request's salt.  So a block is found only behind the very
prefix it was computed after, by the same model, for a request with the same salt: requests with different salts
(the server derives one per API key, and a client may send its own `cache_salt`) never share a block, and cannot
learn from reuse counters or timings what another one sent.  A found block's parent and tokens are compared too;
where they differ (a collision of the digest, not expected in practice), nothing is reused from that block on and
nothing is stored after it, so a collision can only miss, never file a block under a foreign parent.

A block holds, per layer, its positions' keys and values, and the final hidden states of its positions (what the
output head turns into logits: a request that scores its prompt, echo with logprobs, gets the reused positions'
log-probabilities from them, at the cost of the head alone).

Exact: the reused keys and values are the ones an earlier prompt's pass computed for the same tokens at the same
positions, so only the order of floating-point sums differs from a full pass (tests/test_prefix_cache.py bounds
the logits' difference and checks greedy tokens and echo log-probabilities against a server without the cache).
At least the prompt's last token is always computed, as its logits are what the first new token is drawn from.

The cache has a byte budget, and the least recently used blocks leave first.  A request's reused blocks are copied
into its own row of the running batch when it joins, so no running row ever reads the cache and eviction cannot
take a block from under one; while a prompt's new blocks are stored, its own blocks are never the ones evicted.
"""
from __future__ import annotations

import collections
import hashlib
import json
from dataclasses import asdict, dataclass

import torch

from model.kv_cache import KVCache

BLOCK_TOKENS = 16  # vLLM's default block size
# The default budget holds this many full contexts of the served model's blocks (`default_budget_bytes`).
DEFAULT_CONTEXTS = 2
TOKEN_BYTES = 8  # a token id, as the digest reads it: little-endian signed 64-bit


@dataclass
class Block:
    parent: bytes  # the key of the block before it (the root digest for a prompt's first)
    tokens: tuple[int, ...]
    keys: list[torch.Tensor]  # per layer, (heads, BLOCK_TOKENS, head size)
    values: list[torch.Tensor]
    hidden: torch.Tensor  # (BLOCK_TOKENS, embedding): the final LayerNorm's output at its positions
    nbytes: int


@dataclass
class Prefill:
    logits: torch.Tensor  # (rows, positions, vocab): every prompt position's when scored, else the last one's
    reused_tokens: int


def model_identity(model: torch.nn.Module) -> bytes:
    """A digest of what decides a block's keys and values beside its tokens: the model's configuration and the name,
    shape and type of every tensor it holds.  One cache serves one loaded model, whose weights do not change while
    it serves; the identity keeps a cache that ever saw two models (a draft, a reload) from mixing their blocks."""
    layout = [(name, list(t.shape), str(t.dtype)) for name, t in (*model.named_parameters(), *model.named_buffers())]
    described = json.dumps({"config": asdict(model.config), "tensors": layout}, sort_keys=True, default=str)
    return hashlib.sha256(described.encode()).digest()


def root_key(identity: bytes, salt: bytes) -> bytes:
    """The parent of a prompt's first block: the model's identity and the request's salt, each length-prefixed."""
    digest = hashlib.sha256(b"gpt2-prefix-cache-root")
    for part in (identity, salt):
        digest.update(len(part).to_bytes(8, "little") + part)
    return digest.digest()


def block_key(parent: bytes, tokens: tuple[int, ...]) -> bytes:
    """The key of the block of `tokens` after the block (or root) keyed `parent`: SHA-256 over both, every token
    included (a block always holds BLOCK_TOKENS of them, so the bytes have one reading)."""
    return hashlib.sha256(parent + b"".join(t.to_bytes(TOKEN_BYTES, "little", signed=True) for t in tokens)).digest()


def default_budget_bytes(config, dtype: torch.dtype = torch.float32) -> int:
    """DEFAULT_CONTEXTS full contexts of the model's blocks: keys and values of every layer and the final hidden
    state, per position (GPT-2 124M in fp32: 75 KiB a position, 150 MiB in all; GPT-2 Medium: 392 MiB)."""
    width = sum(2 * config.layer_n_head(layer) * config.head_dim for layer in range(config.n_layer)) + config.n_embd
    return DEFAULT_CONTEXTS * config.block_size * width * torch.finfo(dtype).bits // 8


class PrefixCache:
    def __init__(self, budget_bytes: int, identity: bytes, block_tokens: int = BLOCK_TOKENS):
        """`identity`: the served model's `model_identity`."""
        self.budget_bytes = budget_bytes
        self.identity = identity
        self.block_tokens = block_tokens
        self.blocks: collections.OrderedDict[bytes, Block] = collections.OrderedDict()  # least recently used first
        self.nbytes = 0

    def prefill(self, model: torch.nn.Module, cache: KVCache, ids: list[int], scored: bool,
                salt: bytes = b"") -> Prefill:
        """Fill one-row `cache` (empty, room for `ids`) with the prompt `ids`: the cached blocks of its longest
        cached prefix (for requests with this `salt`) copied in, the rest computed in one eager pass; then cache the
        prompt's new full blocks."""
        return self.prefill_rows(model, cache, [ids], scored, [salt])

    def reused_tokens(self, ids: list[int], salt: bytes = b"") -> int:
        """How many of the prompt `ids`' tokens a prefill would take from the cache now (for requests with `salt`);
        its blocks count as just used."""
        return len(self._match(ids, root_key(self.identity, salt))) * self.block_tokens

    def prefill_rows(self, model: torch.nn.Module, cache: KVCache, prompts: list[list[int]], scored: bool,
                     salts: list[bytes]) -> Prefill:
        """`prefill` for several prompts of one length in one pass, row i of `cache` (empty, a row per prompt) for
        `prompts[i]`, with `salts[i]`: every row reuses the blocks of the shortest of their cached prefixes (the
        engine groups prompts whose prefixes are as long, `reused_tokens`), so that the rest has one length too;
        `logits` has a row per prompt, `reused_tokens` is each row's."""
        if len({len(ids) for ids in prompts}) != 1 or len(salts) != len(prompts):
            raise ValueError(f"prompts prefilled together have one length and a salt each: lengths "
                             f"{sorted({len(ids) for ids in prompts})}, {len(salts)} salts for {len(prompts)} prompts")
        roots = [root_key(self.identity, salt) for salt in salts]
        matched = [self._match(ids, root) for ids, root in zip(prompts, roots)]
        found = [blocks[:min(len(b) for b in matched)] for blocks in matched]
        reused = len(found[0]) * self.block_tokens
        for row, blocks in enumerate(found):
            for i, (_, block) in enumerate(blocks):
                cache.put_columns(row, i * self.block_tokens, block.keys, block.values)
        if reused:
            cache.advance(reused)
        rest = torch.tensor([ids[reused:] for ids in prompts], dtype=torch.long, device=cache.k[0].device)
        hidden = model.hidden_states(rest, cache)
        if scored:
            logits = model.lm_head(torch.stack([torch.cat([block.hidden for _, block in blocks] + [hidden[row]])
                                                for row, blocks in enumerate(found)]))
        else:
            logits = model.lm_head(hidden[:, -1:])
        for row, (ids, blocks, root) in enumerate(zip(prompts, found, roots)):
            self._store(ids, cache, row, hidden[row], blocks, root)
        return Prefill(logits[..., :model.config.vocab_size], reused)

    def _match(self, ids: list[int], root: bytes) -> list[tuple[bytes, Block]]:
        """The cached blocks of `ids`' longest cached prefix that leaves its last token to compute, each made the
        most recently used."""
        found, parent = [], root
        for start in range(0, len(ids) - self.block_tokens, self.block_tokens):
            tokens = tuple(ids[start:start + self.block_tokens])
            key = block_key(parent, tokens)
            block = self.blocks.get(key)
            if block is None or block.parent != parent or block.tokens != tokens:
                break
            self.blocks.move_to_end(key)
            found.append((key, block))
            parent = key
        return found

    def _store(self, ids: list[int], cache: KVCache, row: int, hidden: torch.Tensor, found: list[tuple[bytes, Block]],
               root: bytes) -> None:
        """Cache the full blocks of `ids` after the `found` ones, from row `row` of the prefilled `cache` and the
        `hidden` states of the positions computed (those after the found blocks).  Stops at a key that holds another
        block: the blocks after it would be filed behind a prefix they were not computed after."""
        reused = len(found) * self.block_tokens
        pinned = {key for key, _ in found}
        parent = found[-1][0] if found else root
        for start in range(reused, len(ids) - self.block_tokens + 1, self.block_tokens):
            tokens = tuple(ids[start:start + self.block_tokens])
            key = block_key(parent, tokens)
            held = self.blocks.get(key)
            if held is not None and (held.parent != parent or held.tokens != tokens):
                return
            if held is None:
                keys, values = cache.copy_columns(row, start, start + self.block_tokens)
                block = Block(parent, tokens, keys, values,
                              hidden[start - reused:start - reused + self.block_tokens].clone(), 0)
                block.nbytes = sum(t.numel() * t.element_size() for t in (*block.keys, *block.values, block.hidden))
                if not self._make_room(block.nbytes, pinned):
                    return
                self.blocks[key] = block
                self.nbytes += block.nbytes
            pinned.add(key)
            parent = key

    def _make_room(self, nbytes: int, pinned: set[bytes]) -> bool:
        """Evict least recently used blocks, none of `pinned`, until `nbytes` more fit the budget; False if they
        cannot."""
        if nbytes > self.budget_bytes:
            return False
        for key in [key for key in self.blocks if key not in pinned]:
            if self.nbytes + nbytes <= self.budget_bytes:
                break
            self.nbytes -= self.blocks.pop(key).nbytes
        return self.nbytes + nbytes <= self.budget_bytes
