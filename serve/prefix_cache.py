"""Prefix caching: a prompt that starts with the tokens of a recent prompt reuses their keys and values instead of
computing them again (an evaluation harness scores one context once per continuation; few-shot prompts share
their examples).

Prompts are cut into blocks of BLOCK_TOKENS tokens and, as vLLM keys them, a block's identity is a hash of every
token up to its end (its own tokens and its parent block's key), so a block is found only behind the very prefix
it was computed after.  A block holds, per layer, its positions' keys and values, and the final hidden states of
its positions (what the output head turns into logits: a request that scores its prompt, echo with logprobs, gets
the reused positions' log-probabilities from them, at the cost of the head alone).  Lookups compare a found
block's tokens and parent, so a hash collision can only miss, never reuse the wrong block.

Exact: the reused keys and values are the ones an earlier prompt's pass computed for the same tokens at the same
positions, so only the order of floating-point sums differs from a full pass (tests/test_prefix_cache.py bounds
the logits' difference and checks greedy tokens are identical).  At least the prompt's last token is always
computed, as its logits are what the first new token is drawn from.

The cache has a byte budget, and the least recently used blocks leave first.  A request's reused blocks are copied
into its own row of the running batch when it joins (serve/slots.py), so no running row ever reads the cache and
eviction cannot take a block from under one; while a prompt's new blocks are stored, its own blocks are never the
ones evicted.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

import torch

from model.kv_cache import KVCache

BLOCK_TOKENS = 16  # vLLM's default block size


@dataclass
class Block:
    parent: int | None  # the key of the block before it (None for a prompt's first)
    tokens: tuple[int, ...]
    keys: list[torch.Tensor]  # per layer, (heads, BLOCK_TOKENS, head size)
    values: list[torch.Tensor]
    hidden: torch.Tensor  # (BLOCK_TOKENS, embedding): the final LayerNorm's output at its positions
    nbytes: int


@dataclass
class Prefill:
    logits: torch.Tensor  # (1, positions, vocab): every prompt position's when scored, else the last one's
    reused_tokens: int


def block_key(parent: int | None, tokens: tuple[int, ...]) -> int:
    return hash((parent, tokens))


class PrefixCache:
    def __init__(self, budget_bytes: int, block_tokens: int = BLOCK_TOKENS):
        self.budget_bytes = budget_bytes
        self.block_tokens = block_tokens
        self.blocks: collections.OrderedDict[int, Block] = collections.OrderedDict()  # least recently used first
        self.nbytes = 0

    def prefill(self, model: torch.nn.Module, cache: KVCache, ids: list[int], scored: bool) -> Prefill:
        """Fill one-row `cache` (empty, room for `ids`) with the prompt `ids`: the cached blocks of its longest
        cached prefix copied in, the rest computed in one eager pass; then cache the prompt's new full blocks."""
        found = self._match(ids)
        reused = len(found) * self.block_tokens
        for i, (_, block) in enumerate(found):
            columns = slice(i * self.block_tokens, (i + 1) * self.block_tokens)
            for layer, (k, v) in enumerate(zip(block.keys, block.values)):
                cache.k[layer][0, :, columns] = k
                cache.v[layer][0, :, columns] = v
        if reused:
            cache.advance(reused)
        rest = torch.tensor([ids[reused:]], dtype=torch.long, device=cache.k[0].device)
        hidden = model.hidden_states(rest, cache)
        if scored:
            hidden_all = torch.cat([block.hidden[None] for _, block in found] + [hidden], dim=1)
            logits = model.lm_head(hidden_all)
        else:
            logits = model.lm_head(hidden[:, -1:])
        self._store(ids, cache, hidden[0], found)
        return Prefill(logits[..., :model.config.vocab_size], reused)

    def _match(self, ids: list[int]) -> list[tuple[int, Block]]:
        """The cached blocks of `ids`' longest cached prefix that leaves its last token to compute, each made the
        most recently used."""
        found, parent = [], None
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

    def _store(self, ids: list[int], cache: KVCache, hidden: torch.Tensor, found: list[tuple[int, Block]]) -> None:
        """Cache the full blocks of `ids` after the `found` ones, from the prefilled `cache` and the `hidden` states
        of the positions computed (those after the found blocks)."""
        reused = len(found) * self.block_tokens
        pinned = {key for key, _ in found}
        parent = found[-1][0] if found else None
        for start in range(reused, len(ids) - self.block_tokens + 1, self.block_tokens):
            tokens = tuple(ids[start:start + self.block_tokens])
            key = block_key(parent, tokens)
            if key not in self.blocks:
                columns = slice(start, start + self.block_tokens)
                block = Block(parent, tokens, [k[0, :, columns].clone() for k in cache.k],
                              [v[0, :, columns].clone() for v in cache.v],
                              hidden[start - reused:start - reused + self.block_tokens].clone(), 0)
                block.nbytes = sum(t.numel() * t.element_size() for t in (*block.keys, *block.values, block.hidden))
                if not self._make_room(block.nbytes, pinned):
                    return
                self.blocks[key] = block
                self.nbytes += block.nbytes
            pinned.add(key)
            parent = key

    def _make_room(self, nbytes: int, pinned: set[int]) -> bool:
        """Evict least recently used blocks, none of `pinned`, until `nbytes` more fit the budget; False if they
        cannot."""
        if nbytes > self.budget_bytes:
            return False
        for key in [key for key in self.blocks if key not in pinned]:
            if self.nbytes + nbytes <= self.budget_bytes:
                break
            self.nbytes -= self.blocks.pop(key).nbytes
        return self.nbytes + nbytes <= self.budget_bytes
