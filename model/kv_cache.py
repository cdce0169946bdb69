"""The KV cache and the attention inputs a step's tokens get from it.

One cache layout serves every decoding path (generate(), speculative decoding, the server's running batch): each
row holds its sequence from column 0 at its own length (`lengths`), so rows never need aligning or shifting.
Before each forward pass the cache decides the step's `AttentionInputs` (positions, mask, write columns) once;
the model hands that object to every layer, whose keys and values the cache then writes and returns.

KVCache attends the filled columns only, the cheapest eager step; while every row holds the same number of tokens
(plain decoding) its steps need no mask and write one slice.  StaticKVCache keeps every tensor shape fixed from
step to step and advances on the device, so that a step can be captured once as a CUDA graph and replayed
(decode/cuda_graph.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from model.config import GPTConfig
from runtime.errors import UserError


class ContextOverflow(UserError, ValueError):
    """More positions than the model (or its KV cache) has."""


@dataclass
class AttentionInputs:
    """What a forward pass's attention layers need beside the new tokens' keys and values.

    positions: (T,) or (B, T), each new token's position (what the position embedding reads).
    mask: None for causal attention by SDPA's own flag (exact without a cache, for one token per row, and when
        filling an empty cache), else (B or 1, 1, T, keys) True where a token may attend a cached column.
    columns: None to write the new keys and values at the T columns after the cache's `length` (every row holds
        that many), else (B, T): the columns row i writes.
    """
    positions: torch.Tensor
    mask: torch.Tensor | None = None
    columns: torch.Tensor | None = None

    @staticmethod
    def causal(T: int, device) -> AttentionInputs:
        """A pass without a cache: positions 0..T-1, causal."""
        return AttentionInputs(torch.arange(T, device=device))


def write_columns(cache: torch.Tensor, columns: torch.Tensor, new: torch.Tensor) -> None:
    """Write `new` (B, heads, W, head size) into `cache` (B, heads, n, head size) at row i's columns `columns[i]`
    (B, W).  Indexing by (row, column) pairs writes a few columns of a strided view faster than a scatter does."""
    rows = torch.arange(new.size(0), device=new.device)[:, None]
    cache[rows, :, columns] = new.transpose(1, 2)


class CacheWrites(Protocol):
    """What the model's layers do with a cache: write a layer's new keys and values (returning the columns
    attention reads), and count the tokens a pass added.  KVCache does it over its own tensors; a traced step
    (decode/trace.py) over the views of them its graph is handed."""

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               attention: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]: ...

    def advance(self, T: int) -> None: ...


class KVCache:
    """Keys and values (one (B, heads, max_len, head size) tensor per layer), row i filled up to `lengths[i]`.
    `length` is the longest row, the columns a step reads; `aligned` says every row holds `length` tokens.  Both
    are kept on the host, so a step needs no device sync to learn them."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], lengths: torch.Tensor):
        """Over existing tensors (a view of another cache's rows, say); `allocate` makes new ones."""
        self.k, self.v, self.lengths = k, v, lengths
        self.max_len = k[0].size(2)
        self.reread_lengths()

    @classmethod
    def allocate(cls, config: GPTConfig, batch_size: int, max_len: int, device,
                 dtype: torch.dtype = torch.float32) -> KVCache:
        """An empty cache for `batch_size` rows of up to `max_len` tokens of a model with `config`."""
        shape = lambda layer: (batch_size, config.layer_n_head(layer), max_len, config.head_dim)
        return cls([torch.zeros(shape(i), device=device, dtype=dtype) for i in range(config.n_layer)],
                   [torch.zeros(shape(i), device=device, dtype=dtype) for i in range(config.n_layer)],
                   torch.zeros(batch_size, dtype=torch.long, device=device))

    def reread_lengths(self) -> None:
        """Read `length` and `aligned` back from the rows' lengths, after they changed other than by `advance`."""
        self.length = int(self.lengths.max()) if self.lengths.numel() else 0
        self.aligned = self.lengths.numel() == 0 or bool(self.lengths.min() == self.length)

    def check_room(self, T: int) -> None:
        if self.length + T > self.max_len:
            raise ContextOverflow(f"KV cache holds {self.max_len} positions; {self.length + T} requested")

    def columns(self, T: int) -> torch.Tensor:
        """(B, T): where each row's next T tokens go, which are also their positions."""
        return self.lengths[:, None] + torch.arange(T, device=self.lengths.device)

    def attention_inputs(self, T: int) -> AttentionInputs:
        """For the next T tokens of every row."""
        self.check_room(T)
        device = self.lengths.device
        if self.aligned:
            start = self.length
            # The new tokens see every earlier column and each other causally; SDPA's own flag is exact for one
            # token and for an empty cache.
            mask = None if start == 0 or T == 1 else \
                torch.ones(T, start + T, dtype=torch.bool, device=device).tril(diagonal=start)[None, None]
            return AttentionInputs(torch.arange(start, start + T, device=device), mask)
        positions = self.columns(T)
        keys = torch.arange(self.length + T, device=device)
        # Each token sees its own row's columns up to its own: later ones, and what `truncate` dropped, are hidden.
        return AttentionInputs(positions, (keys <= positions[:, :, None])[:, None], columns=positions)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, attention: AttentionInputs):
        """Write a layer's new keys and values (B, heads, T, head size); return the columns attention reads."""
        end = self.length + k.size(2)
        if attention.columns is None:
            self.k[layer][:, :, self.length:end] = k
            self.v[layer][:, :, self.length:end] = v
        else:
            write_columns(self.k[layer], attention.columns, k)
            write_columns(self.v[layer], attention.columns, v)
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, T: int) -> None:
        """Every row gained T tokens."""
        self.lengths += T
        self.length += T

    def truncate(self, lengths: torch.Tensor) -> None:
        """Keep the first `lengths[i]` tokens of row i (at most the ones it holds)."""
        torch.minimum(self.lengths, lengths.to(self.lengths.device), out=self.lengths)  # in place: see first_rows
        self.reread_lengths()

    def first_rows(self, rows: int) -> KVCache:
        """Rows 0..rows-1 as a cache of their own that shares this one's storage (a server's running batch
        in a cache sized for its most rows): what a step writes, advances or truncates there lands here; lengths
        set here directly are read again by the next `first_rows`."""
        return type(self)([k[:rows] for k in self.k], [v[:rows] for v in self.v], self.lengths[:rows])

    def put_row(self, row: int, source: KVCache, source_row: int = 0) -> None:
        """Row `row` holds what `source`'s row `source_row` holds (a one-row prefill's cache, or another row of
        this one's), its length included; what the row held before is gone."""
        end = int(source.lengths[source_row])
        if end > self.max_len:
            raise ContextOverflow(f"KV cache holds {self.max_len} positions; the row to put there holds {end}")
        for layer in range(len(self.k)):
            self.k[layer][row, :, :end] = source.k[layer][source_row, :, :end]
            self.v[layer][row, :, :end] = source.v[layer][source_row, :, :end]
        self.lengths[row] = end  # in place: a captured step reads this tensor
        self.reread_lengths()

    def copy_columns(self, row: int, start: int, end: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of row `row`'s keys and values at columns start..end-1, per layer (heads, end - start, head
        size): what a prefix cache keeps of a prompt's block (decode/prefix_cache.py)."""
        return ([k[row, :, start:end].clone() for k in self.k], [v[row, :, start:end].clone() for v in self.v])

    def put_columns(self, row: int, start: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Write per-layer `keys` and `values` (heads, n, head size) at row `row`'s columns start..start+n-1; the
        row's length is left as it is (`advance` says when the written columns count)."""
        end = start + keys[0].size(1)
        if end > self.max_len:
            raise ContextOverflow(f"KV cache holds {self.max_len} positions; columns up to {end} were to be written")
        for layer, (k, v) in enumerate(zip(keys, values)):
            self.k[layer][row, :, start:end] = k
            self.v[layer][row, :, start:end] = v

    def clear_rows(self, first: int) -> None:
        """Rows `first` and after hold nothing (their keys and values are left, unread)."""
        self.lengths[first:] = 0
        self.reread_lengths()

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices, in that order); the others leave the batch."""
        self.k = [k.index_select(0, rows) for k in self.k]
        self.v = [v.index_select(0, rows) for v in self.v]
        self.lengths = self.lengths.index_select(0, rows)
        self.reread_lengths()


class StaticKVCache(KVCache):
    """A KV cache whose every tensor shape stays the same from step to step, so that a decode step can be
    captured once as a CUDA graph and replayed (decode/cuda_graph.py): attention reads all `max_len` columns
    through a mask that hides each row's unfilled ones, and the rows' lengths, which decide the write columns,
    advance on the device, inside the step."""

    def attention_inputs(self, T: int) -> AttentionInputs:
        self.check_room(T)
        positions = self.columns(T)
        # Made inside the step (not kept): a captured graph must own every tensor it reads but its inputs.
        slots = torch.arange(self.max_len, device=positions.device)
        return AttentionInputs(positions, (slots <= positions[:, :, None])[:, None], columns=positions)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, attention: AttentionInputs):
        write_columns(self.k[layer], attention.columns, k)
        write_columns(self.v[layer], attention.columns, v)
        return self.k[layer], self.v[layer]

    def advance(self, T: int) -> None:
        self.lengths.add_(T)  # on the device: a captured step advances it at every replay
        self.length += T
