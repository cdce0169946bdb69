"""An int8 artifact's weights: the tensors stored for a model quantized by model/int8.py, and the ready GPT
rebuilt from them (each tensor checked for its name, dtype and shape against the config)."""
from __future__ import annotations

import torch
import torch.nn as nn

from model.config import GPTConfig
from model.gpt import GPT
from model.int8 import (EMBEDDING_NAME, HEAD_FORMATS, HEAD_NAME, Fp16WeightLinear, Int8Linear, replace_module,
                        tie_int8_head)
from storage.weights import ArtifactError, empty_model, load_weights


def int8_state_for_saving(model: GPT) -> dict[str, torch.Tensor]:
    """Weights to store: the tied head (weight and scale) is stored once, as the embedding."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    for key in (f"{HEAD_NAME}.weight", f"{HEAD_NAME}.weight_scale"):
        state.pop(key, None)
    return state


def _take(state: dict[str, torch.Tensor], key: str, dtype: torch.dtype, shape: tuple, source: str) -> torch.Tensor:
    if key not in state:
        raise ArtifactError(f"{source}: the int8 weights are missing {key}")
    tensor = state.pop(key)
    if tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
        raise ArtifactError(f"{source}: {key} is {tensor.dtype} {tuple(tensor.shape)}, expected {dtype} "
                            f"{tuple(shape)} for this config")
    return tensor


def build_int8_model(config: GPTConfig, state: dict[str, torch.Tensor], quantization: dict | None,
                     source: str = "weights") -> GPT:
    """A GPT whose quantized layers (as listed in the artifact's `quantization`) are int8 modules, from stored
    tensors; `source` names the weights in error messages."""
    if not isinstance(quantization, dict) or not isinstance(quantization.get("layers"), list):
        raise ArtifactError("config.json of this int8 artifact has no 'quantization' section listing the "
                            "quantized layers; re-create it with `python quantize/dynamic.py`")
    state = dict(state)
    model = empty_model(config)
    for name in quantization["layers"]:
        if not isinstance(name, str):
            raise ArtifactError(f"config.json lists {name!r} as a quantized layer; expected layer names")
        try:
            linear = model.get_submodule(name)
        except AttributeError:
            linear = None
        if not isinstance(linear, nn.Linear):
            raise ArtifactError(f"config.json lists {name!r} as quantized, but the model has no linear layer there")
        out_features, in_features = linear.weight.shape
        weight = _take(state, f"{name}.weight", torch.int8, (out_features, in_features), source)
        scale = _take(state, f"{name}.weight_scale", torch.float32, (out_features,), source)
        bias = None
        if linear.bias is not None:
            bias = _take(state, f"{name}.bias", torch.float32, (out_features,), source)
        replace_module(model, name, Int8Linear(weight, scale, bias))
    head = quantization.get("head")
    if head not in HEAD_FORMATS:
        raise ArtifactError(f"config.json names head format {head!r}; expected one of {HEAD_FORMATS}")
    if head == "int8":
        shape = tuple(model.transformer.wte.weight.shape)
        weight = _take(state, f"{EMBEDDING_NAME}.weight", torch.int8, shape, source)
        scale = _take(state, f"{EMBEDDING_NAME}.weight_scale", torch.float32, shape[:1], source)
        tie_int8_head(model, weight, scale)
    load_weights(model, state, source)
    if head == "fp16":
        model.lm_head = Fp16WeightLinear(model.transformer.wte.weight)
    return model


