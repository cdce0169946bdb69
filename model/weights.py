"""The bottom of model/: reading stored weights into a model, and the error for a folder that cannot be
loaded.  artifact.py, hf.py and int8.py build on it; it imports none of them."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import load_file

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


def load_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Fill the model's still-unmaterialised (meta) tensors from `state` and re-tie a float output head to
    the embedding.  Refuses weights that do not match, and NaN or infinite values (naming the tensor)."""
    tied_head = isinstance(model.lm_head, nn.Linear)
    expected = {k for k, v in model.state_dict().items() if v.is_meta}
    if tied_head:
        expected.discard(HEAD_WEIGHT)
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise ArtifactError(f"weights do not match the config: missing {sorted(missing)[:5]}, "
                            f"unexpected {sorted(unexpected)[:5]}")
    bad = next((k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()), None)
    if bad:
        raise ArtifactError(f"tensor {bad} holds NaN or infinite values; the weights are unusable (train again "
                            f"from an earlier checkpoint)")
    model.load_state_dict(state, strict=False, assign=True)
    if tied_head:
        model.lm_head.weight = model.transformer.wte.weight
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta:
            raise ArtifactError(f"{name} was not restored from the stored weights")
