"""GPT-2 in plain single-device PyTorch (after nanoGPT), with a KV cache.

Parallelism is applied from outside by `parallel/`; nothing here knows about
process groups.  Module names follow Hugging Face's GPT-2 (`transformer.h.0.attn.c_attn`)
so checkpoints map one-to-one.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.config import GPTConfig
from model.head_loss import fuses_on, head_cross_entropy, padded_cross_entropy
from model.kv_cache import AttentionInputs, CacheWrites, ContextOverflow, KVCache


class Linear(nn.Linear):
    """nn.Linear that computes a product of only a few rows (a decoding step) as (W @ x^T)^T on the CPU.

    Same weights, same result up to float rounding; MKL runs that layout of the product faster for a
    dozen rows of GPT-2 widths (see bench/experiments/generate_speed.py), and no slower for one row.
    """
    FEW_ROWS = 16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows > self.FEW_ROWS or x.device.type != "cpu":
            return super().forward(x)
        flat = x.reshape(rows, self.in_features).t()
        out = torch.mm(self.weight, flat) if self.bias is None else torch.addmm(self.bias[:, None], self.weight, flat)
        return out.t().contiguous().view(*x.shape[:-1], self.out_features)


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

    def forward(self, x, attention: AttentionInputs, layer: int = 0, cache: CacheWrites | None = None):
        T = x.size(1)
        q, k, v = self.c_attn(x).split(self.n_head * self.head_dim, dim=2)
        # Shapes from the module's own numbers, not read from x: a traced step (decode/trace.py) then runs no
        # size lookups per layer.
        q, k, v = (t.unflatten(2, (self.n_head, self.head_dim)).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(layer, k, v, attention)
        dropout_p = self.dropout if self.training else 0.0
        mask = attention.mask
        if mask is None:
            # Without a cache, or when prefilling an empty one, the plain causal mask is exact. (bool(): when the
            # step is traced, T is a traced size; each trace serves one token count, so the flag is a constant.)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=bool(T > 1))
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        y = y.transpose(1, 2).flatten(2)
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

    def forward(self, x, attention: AttentionInputs, cache: CacheWrites | None = None):
        x = x + self.attn(self.ln_1(x), attention, self.layer, cache)
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
        for name, p in self.named_parameters():
            if self.is_residual_projection(name):
                self.init_residual_projection(p, config)

    # The initialisation is written as these three steps (after each module's own default) so that
    # model/deferred_init.py can replay it one parameter at a time for a model built on the meta device.
    @staticmethod
    def is_residual_projection(name: str) -> bool:
        return name.endswith("c_proj.weight")

    @staticmethod
    def init_residual_projection(p: torch.Tensor, config: GPTConfig) -> None:
        """GPT-2 scales the residual projections by 1/sqrt(2 * n_layer)."""
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

    def forward(self, idx, targets=None, cache: KVCache | None = None, last_only: bool = False,
                attention: AttentionInputs | None = None):
        """Logits (and the mean cross-entropy when `targets` is given; while training, the loss alone).

        `cache` continues its rows, each from its own length.  `last_only` computes logits for the final position
        only, which is all that sampling needs.  `attention`: see `hidden_states`.
        """
        x = self.hidden_states(idx, cache, last_only, attention)
        if targets is not None and self.training and torch.is_grad_enabled() and type(self.lm_head) is Linear \
                and fuses_on(x.device):
            # Training on the CPU: the head and the loss fused (model/head_loss.py); no logits kept or returned.
            return None, head_cross_entropy(x, self.lm_head.weight, targets, self.config.vocab_size)
        padded = self.lm_head(x)
        vocab = self.config.vocab_size
        if targets is None:
            return padded[..., :vocab], None  # a view: the padding is never sampled
        if not torch.is_grad_enabled():  # evaluation: chunked, no logits-sized temporaries
            return padded[..., :vocab], padded_cross_entropy(padded, targets, vocab)
        return self.training_loss(padded, targets)

    def training_loss(self, padded: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits over the real vocabulary (a view) and their mean cross-entropy, from the padded logits."""
        vocab = self.config.vocab_size
        # The padding at -inf (no probability, no gradient) gives the loss over the real vocabulary without
        # copying the logits to slice them.  (The view is taken after the in-place write: FSDP2 crashes on
        # a view whose base was modified after it was made.)
        padded[..., vocab:] = float("-inf")
        loss = F.cross_entropy(padded.reshape(-1, padded.size(-1)), targets.reshape(-1), ignore_index=-1)
        return padded[..., :vocab], loss

    def hidden_states(self, idx, cache: KVCache | None = None, last_only: bool = False,
                      attention: AttentionInputs | None = None) -> torch.Tensor:
        """The final LayerNorm's output, which the output head turns into logits (see `forward`).  `attention`:
        the tokens' positions, mask and cache columns (model/kv_cache.py), as a traced step takes them for its
        inputs; by default the cache's (causal from position 0 without one)."""
        T = idx.size(1)
        if attention is None:
            start = cache.length if cache is not None else 0
            if start + T > self.config.block_size:
                raise ContextOverflow(f"sequence of {start + T} tokens exceeds block_size={self.config.block_size}")
            attention = cache.attention_inputs(T) if cache is not None else AttentionInputs.causal(T, idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(attention.positions))
        for block in self.transformer.h:
            if self.gradient_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, attention, cache, use_reentrant=False)
            else:
                x = block(x, attention, cache)
        if cache is not None:
            cache.advance(T)
        x = self.transformer.ln_f(x)
        return x[:, -1:] if last_only else x
