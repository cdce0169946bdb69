"""Int8 modules for dynamic quantization (an int8 artifact is stored and rebuilt by storage/int8_weights.py).

Weights are int8 per output channel, symmetric (zero point 0, scale = max|w| / 127), so the artifact
holds only `<layer>.weight` (int8), `<layer>.weight_scale` (float32) and the float bias.  On CPU the
matmul runs in PyTorch's quantized engine (fbgemm / x86, or qnnpack on ARM): activations are
quantized per tensor on the fly and the product is accumulated in int32, with activations of 8 bits where this
CPU's kernel sums them exactly and of 7 where it could overflow (`full_range_activations`).  That engine has no GPU
kernels, so on any other device the same module runs weight-only: int8 weights are dequantized per
matmul (memory saved, float arithmetic), with a warning saying so.

The tied embedding / output head is int8 (embedding rows and head share one int8 matrix; quantize/dynamic.py's
default), fp16 (a half-precision copy used only for the head matmul, derived at load time) or fp32 (unchanged).
"""
from __future__ import annotations

import functools
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.gpt import GPT

INT8_MAX = 127
# The head is tied to the token embedding: quantizing it quantizes the embedding rows too.
HEAD_NAME = "lm_head"
EMBEDDING_NAME = "transformer.wte"


def block_linear_names(model: GPT) -> list[str]:
    """The nn.Linear layers inside the transformer blocks (attention and MLP projections)."""
    return [name for name, module in model.named_modules()
            if name.startswith("transformer.h.") and isinstance(module, nn.Linear)]


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: (int8 weight, float32 scale per row)."""
    weight = weight.detach().float()
    # An all-zero row (a pruned unit) would get scale 0; any positive scale reproduces it exactly.
    scale = (weight.abs().amax(dim=1) / INT8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    quantized = torch.round(weight / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return quantized, scale


class Int8Linear(nn.Module):
    """A linear layer with int8 per-channel weights and dynamically quantized activations (on CPU)."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise ValueError(f"Int8Linear needs a 2-D int8 weight, got {weight.dtype} {tuple(weight.shape)}")
        if weight_scale.shape != (weight.size(0),):
            raise ValueError(f"weight_scale has shape {tuple(weight_scale.shape)}, expected ({weight.size(0)},)")
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale.float())
        self.register_buffer("bias", None if bias is None else bias.float())
        self._pack()

    @classmethod
    def from_float(cls, linear: nn.Linear) -> "Int8Linear":
        weight, scale = quantize_per_channel(linear.weight)
        return cls(weight, scale, None if linear.bias is None else linear.bias.detach().float().clone())

    def _pack(self) -> None:
        # The quantized engine wants its own weight layout; it is a derived copy, never saved.
        # Packing needs CPU tensors; a module loaded straight onto another device never uses it.
        self._packed = _prepack(self.weight, self.weight_scale, self.bias)
        full_range_activations()  # decided here, once, so that no forward (nor a trace of one) runs the probe

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.weight.to(dtype) * self.weight_scale.to(dtype)[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype == torch.float32:
            return dynamic_product(x, self._packed, reduce_range=not full_range_activations())
        warnings.warn(f"PyTorch's int8 dynamic-quantization kernels take float32 CPU input only; for "
                      f"{x.dtype} input on {x.device} this int8 model runs weight-only (int8 weights "
                      f"dequantized for each matmul): it saves memory but is not the CPU speed-up", stacklevel=2)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantized_weight(x.dtype), bias)

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._pack()  # the packed copy must follow weights loaded in place

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _prepack(weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
    weight = weight.cpu()
    with warnings.catch_warnings():
        # torch 2.13 marks quantized tensors deprecated (pytorch#184982); they are still the only
        # way into the engine that measured fastest here (measured in quantize/dynamic.py), and
        # torch is pinned, so the notice would only repeat once per layer at every load.
        warnings.filterwarnings("ignore", message="torch.quantize_per_tensor, torch.quantize_per_channel")
        qweight = torch._make_per_channel_quantized_tensor(
            weight, scale.cpu().double(), torch.zeros(weight.size(0), dtype=torch.int64), 0)
    return torch.ops.quantized.linear_prepack(qweight, None if bias is None else bias.cpu())


def dynamic_product(x: torch.Tensor, packed, reduce_range: bool) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic(x, packed, reduce_range=reduce_range)


# What an overflow costs in the probe below: each saturated pair of products loses about 2 (32,003 of 64,770 in
# units of the two scales, 2/255 and 1/127); without one, 8-bit rounding of 64 activations moves it by 0.25 at most.
OVERFLOW_ERROR = 1.0


@functools.cache
def full_range_activations() -> bool:
    """Whether this CPU's int8 product is exact with 8-bit activations.  fbgemm on AVX2 without VNNI adds pairs of
    u8 x s8 products in int16, which 8-bit activations can overflow (hence PyTorch's 7-bit `reduce_range`); with VNNI
    it accumulates in int32.  Measured once, on a product made to overflow an int16 pair sum: activations at the top
    of their range (255) against weights of 127.  Eight bits halve the activations' rounding step, which matters
    most where the rows' logits are close."""
    weight = torch.ones(8, 64)
    x = torch.ones(1, 64)
    x[0, 0] = -1.0  # a range of [-1, 1]: the zero point mid-range, 1 quantized to 255
    product = dynamic_product(x, _prepack(*quantize_per_channel(weight), None), reduce_range=False)
    return bool((product - x @ weight.t()).abs().max() < OVERFLOW_ERROR)


class Int8Embedding(nn.Module):
    """Token embedding whose rows are stored int8 (shared with a quantized, tied output head)."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale.float())

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, self.weight).float() * self.weight_scale[idx].unsqueeze(-1)


class Fp16WeightLinear(nn.Module):
    """The tied output head computed from a half-precision copy of its weight (fbgemm's fp16 GEMM).

    Still floating point (an 11-bit significand, finer than per-row int8's 256 levels), but the matmul reads half
    the bytes, which is what a batch-1 decoding step over a 50k-row head is limited by.  The fp32
    weight stays the stored, tied parameter; the fp16 copy is derived at load time.
    """

    def __init__(self, weight: nn.Parameter):
        super().__init__()
        self.weight = weight
        try:
            self._packed = torch.ops.quantized.linear_prepack_fp16(weight.detach().cpu().float(), None)
        except RuntimeError as e:
            raise ValueError(f"the fp16 head needs PyTorch's fbgemm/x86 quantized engine, which this machine "
                             f"lacks ({torch.backends.quantized.engine}); use head fp32 or int8") from e

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype == torch.float32:
            return torch.ops.quantized.linear_dynamic_fp16(x, self._packed)
        warnings.warn(f"the fp16 head kernel takes float32 CPU input only; for {x.dtype} input on {x.device} "
                      f"the head runs from its stored fp32 weight", stacklevel=2)
        return F.linear(x, self.weight.to(x.dtype))


def replace_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


HEAD_FORMATS = ("fp32", "fp16", "int8")


def quantize_model(model: GPT, head: str = "fp32") -> dict:
    """Swap the block linears for int8 modules, and give the tied head the requested format, in place.

    Returns the description stored in the artifact's config.json under "quantization".
    """
    if head not in HEAD_FORMATS:
        raise ValueError(f"head format {head!r} is not one of {HEAD_FORMATS}")
    layers = block_linear_names(model)
    for name in layers:
        replace_module(model, name, Int8Linear.from_float(model.get_submodule(name)))
    if head == "int8":
        weight, scale = quantize_per_channel(model.transformer.wte.weight)
        tie_int8_head(model, weight, scale)
    elif head == "fp16":
        model.lm_head = Fp16WeightLinear(model.transformer.wte.weight)
    return quantization_description(layers, head)


def quantization_description(layers: list[str], head: str) -> dict:
    return {"scheme": "dynamic int8: weights symmetric per output channel (zero point 0), "
                      "activations per tensor at run time",
            "layers": layers, "head": head}


def tie_int8_head(model: GPT, weight: torch.Tensor, scale: torch.Tensor) -> None:
    model.transformer.wte = Int8Embedding(weight, scale)
    model.lm_head = Int8Linear(weight, scale, None)
    # One int8 tensor and one scale vector serve both, as the float model shares one matrix.
    model.lm_head.weight = model.transformer.wte.weight
    model.lm_head.weight_scale = model.transformer.wte.weight_scale
