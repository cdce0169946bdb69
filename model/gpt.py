"""GPT-2 in plain single-device PyTorch (after nanoGPT), with a KV cache.

Parallelism is applied from outside by `parallel/`; nothing here knows about
process groups.  Module names follow Hugging Face's GPT-2 (`transformer.h.0.attn.c_attn`)
so checkpoints map one-to-one.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.config import GPTConfig
from model.head_loss import head_cross_entropy, padded_cross_entropy
from runtime.errors import UserError


class ContextOverflow(UserError, ValueError):
    """More positions than the model (or its KV cache) has."""


class Linear(nn.Linear):
    """nn.Linear that computes a product of only a few rows (a decoding step) as (W @ x^T)^T on the CPU.

    Same weights, same result up to float rounding; MKL runs that layout of the product about 2x
    faster for 12 rows of GPT-2 widths (see bench/experiments/generate_speed.py), and no slower for one row.
    """
    FEW_ROWS = 16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows > self.FEW_ROWS or x.device.type != "cpu":
            return super().forward(x)
        flat = x.reshape(rows, self.in_features).t()
        out = torch.mm(self.weight, flat) if self.bias is None else torch.addmm(self.bias[:, None], self.weight, flat)
        return out.t().contiguous().view(*x.shape[:-1], self.out_features)


def write_columns(cache: torch.Tensor, columns: torch.Tensor, new: torch.Tensor) -> None:
    """Write `new` (B, heads, W, head size) into `cache` (B, heads, n, head size) at row i's columns `columns[i]`
    (B, W).  Indexing by (row, column) pairs writes a few columns of a strided view faster than a scatter does."""
    rows = torch.arange(new.size(0), device=new.device)[:, None]
    cache[rows, :, columns] = new.transpose(1, 2)


class KVCache:
    """Preallocated keys and values for every layer; `length` tokens are filled."""

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int, device, dtype=torch.float32):
        self.max_len = max_len
        shape = lambda layer: (batch_size, config.layer_n_head(layer), max_len, config.head_dim)
        self.k = [torch.zeros(shape(i), device=device, dtype=dtype) for i in range(config.n_layer)]
        self.v = [torch.zeros(shape(i), device=device, dtype=dtype) for i in range(config.n_layer)]
        self.length = 0

    def check_room(self, T: int) -> None:
        if self.length + T > self.max_len:
            raise ContextOverflow(f"KV cache holds {self.max_len} positions; {self.length + T} requested")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self.check_room(k.size(2))
        end = self.length + k.size(2)
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def attention_inputs(self, T: int, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Positions and mask for the next T tokens when the cache decides them (StaticKVCache, RaggedKVCache);
        None here."""
        return None

    def advance(self, T: int) -> None:
        self.length += T


class StaticKVCache(KVCache):
    """A KV cache whose every tensor shape stays the same from step to step, so that a decode step can be
    captured once as a CUDA graph and replayed (model/decode_graph.py).  The write position is a device
    tensor that the step itself advances, and attention reads all `max_len` slots through a mask that
    hides the unfilled ones."""

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int, device, dtype=torch.float32):
        super().__init__(config, batch_size, max_len, device, dtype)
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.slots = torch.arange(max_len, device=device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        index = self.position + torch.arange(k.size(2), device=k.device)
        self.k[layer].index_copy_(2, index, k)
        self.v[layer].index_copy_(2, index, v)
        return self.k[layer], self.v[layer]

    def attention_inputs(self, T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        self.check_room(T)
        positions = self.position + torch.arange(T, device=device)
        return positions, (self.slots[None, :] <= positions[:, None])[None, None]  # (1, 1, T, max_len)

    def advance(self, T: int) -> None:
        super().advance(T)
        self.position.add_(T)  # on the device: a captured step advances it at every replay


class RaggedKVCache(KVCache):
    """A KV cache whose rows hold different numbers of tokens, each row from column 0 (`lengths`): speculative
    decoding keeps a different number of tokens in each row after a step (model/speculative.py).  A row's new
    tokens go to its own next columns, at its own positions; the mask lets each query see its row's columns up to
    its own, which hides later tokens and what `truncate` dropped (stale until overwritten).  `length` is the
    longest row, the columns a step reads."""

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int, device, dtype=torch.float32):
        super().__init__(config, batch_size, max_len, device, dtype)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)

    def columns(self, T: int) -> torch.Tensor:
        """(B, T): where each row's next T tokens go, which are also their positions."""
        return self.lengths[:, None] + torch.arange(T, device=self.lengths.device)

    def attention_inputs(self, T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        self.check_room(T)
        positions = self.columns(T)
        keys = torch.arange(self.length + T, device=device)
        return positions, (keys <= positions[:, :, None])[:, None]  # (B, 1, T, length + T)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self.check_room(k.size(2))
        columns = self.columns(k.size(2))
        write_columns(self.k[layer], columns, k)
        write_columns(self.v[layer], columns, v)
        end = self.length + k.size(2)
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, T: int) -> None:
        self.lengths += T
        self.length = int(self.lengths.max())

    def truncate(self, lengths: torch.Tensor) -> None:
        """Keep the first `lengths[i]` tokens of row i (at most the ones it holds)."""
        torch.minimum(self.lengths, lengths.to(self.lengths.device), out=self.lengths)  # in place: see first_rows
        self.length = int(self.lengths.max())

    def first_rows(self, rows: int) -> RaggedKVCache:
        """Rows 0..rows-1 as a cache of their own that shares this one's storage (a server's running batch
        in a cache sized for its most rows): what a step writes, advances or truncates there lands here."""
        view = copy.copy(self)
        view.k, view.v = [k[:rows] for k in self.k], [v[:rows] for v in self.v]
        view.lengths = self.lengths[:rows]
        view.length = int(view.lengths.max()) if rows else 0
        return view

    def aligned(self) -> bool:
        """Whether every row holds `length` tokens, so that a step writes one column for all of them."""
        return bool(self.lengths.min() == self.length)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices, in that order); the others leave the batch."""
        self.k = [k.index_select(0, rows) for k in self.k]
        self.v = [v.index_select(0, rows) for v in self.v]
        self.lengths = self.lengths.index_select(0, rows)
        self.length = int(self.lengths.max())


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.head_dim = config.head_dim
        width = n_head * config.head_dim
        # Fused projection laid out [q | k | v], each block head-major, as in GPT-2.
        self.c_attn = Linear(config.n_embd, 3 * width, bias=config.bias)
        self.c_proj = Linear(width, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout

    def forward(self, x, layer: int = 0, cache: KVCache | None = None, mask: torch.Tensor | None = None):
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).split(self.n_head * self.head_dim, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(layer, k, v)
        dropout_p = self.dropout if self.training else 0.0
        if mask is None:
            # Without a cache, or when prefilling an empty one, the plain causal mask is exact. (bool(): when the
            # step is traced, T is a traced size; each trace serves one token count, so the flag is a constant.)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=bool(T > 1))
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig, hidden: int):
        super().__init__()
        self.c_fc = Linear(config.n_embd, hidden, bias=config.bias)
        self.c_proj = Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.attn = CausalSelfAttention(config, config.layer_n_head(layer))
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.mlp = MLP(config, config.layer_mlp_hidden(layer))

    def forward(self, x, cache: KVCache | None = None, mask: torch.Tensor | None = None):
        x = x + self.attn(self.ln_1(x), self.layer, cache, mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList(Block(config, i) for i in range(config.n_layer)),
            ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias),
        ))
        self.lm_head = Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in GPT-2
        # Activation checkpointing is switched on by the trainer; the model only obeys it.
        self.gradient_checkpointing = False
        self.apply(self._init_weights)
        # GPT-2 scales the residual projections by 1/sqrt(2 * n_layer).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_parameters(self, padded_vocab: bool = True) -> int:
        """Unique parameters; with `padded_vocab=False`, as Hugging Face counts GPT-2."""
        n = sum(p.numel() for p in self.parameters())
        if not padded_vocab:
            n -= (self.config.padded_vocab_size - self.config.vocab_size) * self.config.n_embd
        return n

    def forward(self, idx, targets=None, cache: KVCache | None = None, last_only: bool = False):
        """Logits (and the mean cross-entropy when `targets` is given; while training, the loss alone).

        `cache` continues its rows: from `cache.length`, or where the cache says (a RaggedKVCache's rows each at
        its own length).  `last_only` computes logits for the final position only, which is all that sampling
        needs.
        """
        x = self.hidden_states(idx, cache, last_only)
        if targets is not None and self.training and torch.is_grad_enabled() and type(self.lm_head) is Linear:
            # Training: the head and the loss fused (model/head_loss.py); no logits are kept or returned.
            return None, head_cross_entropy(x, self.lm_head.weight, targets, self.config.vocab_size)
        padded = self.lm_head(x)
        vocab = self.config.vocab_size
        if targets is None:
            return padded[..., :vocab], None  # a view: the padding is never sampled
        if not torch.is_grad_enabled():  # evaluation: chunked, no logits-sized temporaries
            return padded[..., :vocab], padded_cross_entropy(padded, targets, vocab)
        # The padding at -inf (no probability, no gradient) gives the loss over the real vocabulary without
        # copying the logits to slice them.  (The view is taken after the in-place write: FSDP2 crashes on
        # a view whose base was modified after it was made.)
        padded[..., vocab:] = float("-inf")
        loss = F.cross_entropy(padded.reshape(-1, padded.size(-1)), targets.reshape(-1), ignore_index=-1)
        return padded[..., :vocab], loss

    def hidden_states(self, idx, cache: KVCache | None = None, last_only: bool = False) -> torch.Tensor:
        """The final LayerNorm's output, which the output head turns into logits (see `forward`)."""
        T = idx.size(1)
        start = cache.length if cache is not None else 0
        decided = cache.attention_inputs(T, idx.device) if cache is not None else None
        if decided is not None:
            positions, mask = decided
        else:
            if start + T > self.config.block_size:
                raise ContextOverflow(f"sequence of {start + T} tokens exceeds block_size={self.config.block_size}")
            positions = torch.arange(start, start + T, device=idx.device)
            # SDPA's own causal flag is exact without a cache, for a one-token step, and when prefilling an empty
            # cache; otherwise the new tokens see every earlier column and each other causally.
            mask = None if start == 0 or T == 1 else \
                torch.ones(T, start + T, dtype=torch.bool, device=idx.device).tril(diagonal=start)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(positions))
        for block in self.transformer.h:
            if self.gradient_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, cache, mask, use_reentrant=False)
            else:
                x = block(x, cache, mask)
        if cache is not None:
            cache.advance(T)
        x = self.transformer.ln_f(x)
        return x[:, -1:] if last_only else x
