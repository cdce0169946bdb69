"""Hugging Face GPT-2 checkpoints (`model.safetensors` + `config.json`): their config and weights in our terms
and back (storage/export.py writes them).

Hugging Face stores GPT-2's projections as Conv1D, weight shape (in, out): they are transposed
to nn.Linear's (out, in) on the way in and back on the way out.
"""
from __future__ import annotations

from pathlib import Path

import torch

from model.config import ConfigError, GPTConfig
from model.gpt import GPT
from storage.weights import ArtifactError, model_from_weights, read_safetensors

CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Causal-mask buffers some transformers versions save (`h.0.attn.bias`); they are not weights.
IGNORED_BUFFERS = ("bias", "masked_bias")


def config_from_hf(hf: dict, path: Path) -> GPTConfig:
    """The GPTConfig of a Hugging Face GPT-2 config.json (`path`, named in errors)."""
    if hf.get("model_type") != "gpt2":
        raise ArtifactError(f"config.json has model_type {hf.get('model_type')!r}; only GPT-2 is supported")
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ArtifactError(f"activation {hf['activation_function']!r} is not GPT-2's tanh GELU")
    try:
        return GPTConfig(n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=hf["n_embd"],
                         block_size=hf["n_positions"], vocab_size=hf["vocab_size"],
                         layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5), dropout=0.0)
    except KeyError as e:
        raise ArtifactError(f"{path} has no {e}; it is not a complete Hugging Face GPT-2 config") from e
    except (ConfigError, TypeError, ValueError) as e:
        raise ArtifactError(f"{path}: {e}; it is not a usable Hugging Face GPT-2 config") from e


def config_to_hf(config: GPTConfig) -> dict:
    """The Hugging Face GPT-2 config.json of `config` (what `config_from_hf` reads back)."""
    if config.mlp_hidden is not None or config.n_head_per_layer is not None:
        raise ValueError("a row-pruned model has per-layer widths that Hugging Face GPT-2 cannot represent")
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": config.n_layer,
            "n_head": config.n_head, "n_embd": config.n_embd, "n_positions": config.block_size,
            "n_ctx": config.block_size, "vocab_size": config.vocab_size, "layer_norm_epsilon": config.layer_norm_eps,
            "activation_function": "gelu_new", "bos_token_id": 50256, "eos_token_id": 50256,
            "tie_word_embeddings": True}


def hf_to_ours(hf_state: dict[str, torch.Tensor], config: GPTConfig,
               source: str | Path = "the weights") -> dict[str, torch.Tensor]:
    """Their tensors under our names and layout; `source` names the file in errors (a matrix that is not one)."""
    state = {}
    for key, value in hf_state.items():
        key = key.removeprefix("transformer.")
        parent, _, leaf = key.rpartition(".")
        if (parent.endswith(".attn") and leaf in IGNORED_BUFFERS) or key == "lm_head.weight":
            continue
        if key.endswith(CONV1D_SUFFIXES) or key == "wte.weight":
            value = matrix(value, key, source)
        if key.endswith(CONV1D_SUFFIXES):
            value = value.t()
        state[f"transformer.{key}"] = value.contiguous()
    if "transformer.wte.weight" not in state:
        raise ArtifactError(f"{source} has no wte.weight (the token embedding); it is not a GPT-2 checkpoint")
    wte = state["transformer.wte.weight"]
    pad = config.padded_vocab_size - wte.size(0)
    if pad > 0:  # more rows than the config allows: load_weights names the shape
        state["transformer.wte.weight"] = torch.cat([wte, wte.new_zeros(pad, wte.size(1))])
    return state


def matrix(value: torch.Tensor, key: str, source: str | Path) -> torch.Tensor:
    if value.dim() != 2:
        raise ArtifactError(f"{source}: tensor {key} has shape {tuple(value.shape)}, not a matrix; the checkpoint "
                            f"is damaged")
    return value


def ours_to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    hf = {}
    for key, value in state.items():
        if key == "lm_head.weight":
            continue
        if key == "transformer.wte.weight":
            value = value[: config.vocab_size]
        if key.endswith(CONV1D_SUFFIXES):
            value = value.t()
        hf[key.removeprefix("transformer.")] = value.detach().contiguous().cpu()
    return hf


def hf_weights(folder: Path) -> Path:
    """A Hugging Face folder's weights file, which must be safetensors."""
    weights = folder / "model.safetensors"
    if not weights.exists():
        raise ArtifactError(f"{folder} has no model.safetensors (pickled pytorch_model.bin is not loaded; "
                            f"convert it with transformers' save_pretrained(safe_serialization=True))")
    return weights


def load_hf_gpt2(folder: Path, config: GPTConfig) -> GPT:
    """The Hugging Face GPT-2 folder whose config.json gave `config`."""
    weights = hf_weights(folder)
    state = hf_to_ours(read_safetensors(weights), config, weights)
    return model_from_weights(config, state, str(weights))
