"""The bottom of storage/: reading stored weights into a model, and the error for a folder that cannot be
loaded.  artifact.py, hf.py and int8_weights.py build on it; it imports none of them."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import load_file

from model.config import GPTConfig
from model.gpt import GPT
from runtime.errors import UserError

HEAD_WEIGHT = "lm_head.weight"


class ArtifactError(UserError, ValueError):
    """A folder that is missing, incomplete or not an artifact this project can load."""


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.exists():
        raise ArtifactError(f"{path.parent} has no {path.name}; the checkpoint is incomplete")
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises several types for damaged files
        raise ArtifactError(f"could not read {path}: {e}; the file is damaged, re-create it") from e


def model_from_weights(config: GPTConfig, state: dict[str, torch.Tensor], source: str = "weights") -> GPT:
    """A GPT of `config` holding `state`: built on the meta device (no random initialisation to throw away),
    then filled by `load_weights`."""
    with torch.device("meta"):
        model = GPT(config)
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
