"""The bottom of storage/: reading stored weights into a model, and the error for a folder that cannot be
loaded.  artifact.py, hf.py and int8_weights.py build on it; it imports none of them."""
from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import load_file

from model.config import GPTConfig
from model.deferred_init import empty_model
from model.gpt import GPT
from runtime.errors import UserError

HEAD_WEIGHT = "lm_head.weight"
# A block's tensors in every stored layout: `transformer.h.3.mlp.c_fc.weight`, Hugging Face's `h.3.mlp.c_fc.weight`.
LAYER_NAME = re.compile(r"(?:^|\.)h\.(\d{1,9})\.")
REMAKE = "re-create the checkpoint with the tool that wrote it"


class ArtifactError(UserError, ValueError):
    """A folder that is missing, incomplete or not an artifact this project can load."""


def read_header(path: Path) -> dict[str, list[int]]:
    """Each stored tensor's shape, from the file's header alone: no tensor is read, and the header's offsets
    are checked against the file's size."""
    if not path.exists():
        raise ArtifactError(f"{path.parent} has no {path.name}; the checkpoint is incomplete")
    try:
        with safe_open(str(path), "pt") as f:
            return {name: f.get_slice(name).get_shape() for name in f.keys()}
    except Exception as e:  # safetensors raises several types for damaged files
        raise ArtifactError(f"could not read {path}: {one_line(e)}; the file is damaged, re-create it") from e


def one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__


def stored_numbers(config: GPTConfig) -> int:
    """The numbers of `config`'s matrices, as the model holds them (the embedding padded, which Hugging Face's
    layout stores unpadded: a few rows, far below the bytes every stored number takes).  Computed, not built: a
    config that names a model larger than its weights file is refused before any tensor of that size is made."""
    e = config.n_embd
    heads = sum(config.n_head_per_layer) if config.n_head_per_layer else config.n_head * config.n_layer
    hidden = sum(config.mlp_hidden) if config.mlp_hidden else 4 * e * config.n_layer
    return (config.padded_vocab_size + config.block_size) * e + 4 * heads * config.head_dim * e + 2 * hidden * e


def check_header(config: GPTConfig, shapes: dict[str, list[int]], path: Path, config_path: Path) -> None:
    """The weights file can hold a model of `config`'s size (every number takes a byte at least) and holds its
    layers.  Names, shapes and dtypes are checked tensor by tensor once read; these checks come first so that a
    damaged config never builds a model of any size."""
    needed, size = stored_numbers(config), path.stat().st_size
    if needed > size:
        raise ArtifactError(f"{config_path} describes a model of at least {needed:,} weights, more than the "
                            f"{size:,} bytes of {path} can hold; the two files are not one save, {REMAKE}")
    layers = {int(m.group(1)) for name in shapes if (m := LAYER_NAME.search(name))}
    if len(layers) != config.n_layer or layers != set(range(len(layers))):
        raise ArtifactError(f"{config_path} says n_layer {config.n_layer} but {path} holds {len(layers)} "
                            f"layers; the two files are not one save, {REMAKE}")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.exists():
        raise ArtifactError(f"{path.parent} has no {path.name}; the checkpoint is incomplete")
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises several types for damaged files
        raise ArtifactError(f"could not read {path}: {one_line(e)}; the file is damaged, re-create it") from e


def in_dtype(tensor: torch.Tensor, dtype: torch.dtype, name: str, source: str) -> torch.Tensor:
    """A stored tensor in the model's dtype: another floating-point precision (a half-precision Hugging Face
    file) is converted; integers or booleans where the model has floating-point weights are damage."""
    if tensor.dtype == dtype:
        return tensor
    if tensor.is_floating_point() and dtype.is_floating_point:
        return tensor.to(dtype)
    raise ArtifactError(f"{source}: tensor {name} is stored as {tensor.dtype} but the model needs {dtype}; the "
                        f"checkpoint is damaged")


def model_from_weights(config: GPTConfig, state: dict[str, torch.Tensor], source: str = "weights") -> GPT:
    """A GPT of `config` holding `state`: built empty (`empty_model`), then filled by `load_weights`."""
    model = empty_model(config)
    load_weights(model, state, source)
    return model


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], source: str = "weights") -> None:
    """Fill the model's still-unmaterialised (meta) tensors from `state` and re-tie a float output head to
    the embedding.  Refuses weights that do not match in names or shapes, and NaN or infinite values, in one
    line naming `source` and the tensor."""
    tied_head = isinstance(model.lm_head, nn.Linear)
    expected = {k: v for k, v in model.state_dict().items() if v.is_meta}
    if tied_head:
        expected.pop(HEAD_WEIGHT, None)
    missing, unexpected = set(expected) - set(state), set(state) - set(expected)
    if missing or unexpected:
        raise ArtifactError(f"{source}: the weights do not match the config: missing {sorted(missing)[:5]}, "
                            f"unexpected {sorted(unexpected)[:5]}")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise ArtifactError(f"{source}: tensor {name} has shape {tuple(tensor.shape)} but the config implies "
                                f"{tuple(expected[name].shape)}; the checkpoint is damaged")
    state = {name: in_dtype(tensor, expected[name].dtype, name, source) for name, tensor in state.items()}
    bad = next((k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()), None)
    if bad:
        raise ArtifactError(f"{source}: tensor {bad} holds NaN or infinite values; the weights are unusable "
                            f"(train again from an earlier checkpoint)")
    model.load_state_dict(state, strict=False, assign=True)
    if tied_head:
        model.lm_head.weight = model.transformer.wte.weight
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta:
            raise ArtifactError(f"{name} was not restored from the stored weights")
