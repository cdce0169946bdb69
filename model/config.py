"""Typed model configuration and the named presets.

One dataclass describes the architecture; it is saved as `config.json` in every
artifact, so any tool rebuilds the model from the folder alone.  Row pruning
records the surviving width of each layer here (`mlp_hidden`, `n_head_per_layer`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from runtime.errors import UserError

GPT2_VOCAB_SIZE = 50257
EOT_TOKEN = 50256



class ConfigError(UserError, ValueError):
    """A model configuration that cannot be built; the message names the field."""

@dataclass
class GPTConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = GPT2_VOCAB_SIZE
    # Embedding rows are padded to a multiple of this for faster matmuls; padded
    # logits are sliced off before the loss and sampling.
    vocab_pad_multiple: int = 64
    dropout: float = 0.0
    bias: bool = True
    layer_norm_eps: float = 1e-5
    # Per-layer widths after structured pruning; None means the dense width
    # (4 * n_embd hidden units, n_head heads) in every layer.
    mlp_hidden: list[int] | None = None
    n_head_per_layer: list[int] | None = None

    def __post_init__(self):
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "vocab_pad_multiple"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        for name in ("dropout", "layer_norm_eps"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not math.isfinite(value):
                raise ConfigError(f"{name}={value!r} must be a finite number")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout={self.dropout!r} must be in [0, 1)")
        if self.layer_norm_eps <= 0:
            raise ConfigError(f"layer_norm_eps={self.layer_norm_eps!r} must be positive")
        if type(self.bias) is not bool:
            raise ConfigError(f"bias={self.bias!r} must be true or false")
        if self.n_embd % self.n_head:
            raise ConfigError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        for name in ("mlp_hidden", "n_head_per_layer"):
            widths = getattr(self, name)
            if widths is None:
                continue
            if not isinstance(widths, list) or any(type(w) is not int or w < 1 for w in widths):
                raise ConfigError(f"{name}={widths!r} must be a list of positive integers, one per layer")
            if len(widths) != self.n_layer:
                raise ConfigError(f"{name} has {len(widths)} entries but the model has {self.n_layer} layers")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        m = self.vocab_pad_multiple
        return (self.vocab_size + m - 1) // m * m

    def layer_mlp_hidden(self, layer: int) -> int:
        return 4 * self.n_embd if self.mlp_hidden is None else self.mlp_hidden[layer]

    def layer_n_head(self, layer: int) -> int:
        return self.n_head if self.n_head_per_layer is None else self.n_head_per_layer[layer]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown model config keys {sorted(unknown)}; known keys are {sorted(known)}")
        return cls(**d)


PRESETS: dict[str, dict] = {
    # CPU-sized presets for the demo, the tests and quick experiments.
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=256),
    "small-cpu": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
    # The four GPT-2 sizes (Radford et al., 2019).
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),
}


def preset(name: str, **overrides) -> GPTConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
    return GPTConfig(**{**PRESETS[name], **overrides})
