"""Float linear layers for inference on the CPU, with the weight reordered once into oneDNN's blocked layout.

A decoding step multiplies each weight matrix by one row per sequence, so it is bound by reading the
weights from memory. PyTorch's default CPU path for that product (MKL) does not stream a weight at the machine's
read rate on every host (on one 2-core EPYC its one-row product ran on one of the two cores); oneDNN's product
over a weight packed ahead of time read GPT-2 124M's matrices faster on the hosts measured. How much, per
product and per host: bench/standalone/decode_profile.py (bench/results/decode_profile.md), and the whole step against
ONNX Runtime and llama.cpp: bench/experiments/generate_speed.py. One row (a decoding step at batch 1) is the
exception: there a batched product over the weight cut into one block of rows per thread, a view with no copy,
streams the weight faster than either library's one-row product. The packed copy is derived and never saved:
the module keeps the original parameter, so a tied head stays tied and checkpoints, exports and state dicts are
unchanged.

`pack_for_inference(model)` swaps the layers in place and says what it did; sample.py, the server, the
scorecard and the speed benchmarks call it. Training and anything that needs gradients keep nn.Linear's
product (the packed one has no backward), and so do other devices and dtypes.
"""
from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary


# What pack_for_inference says it did, after the count of layers.
PACKED = "linear layers packed for oneDNN (float32, CPU; one row: blocks of weight rows per thread)"

# weight -> (its version when packed, the packed copy): one copy per weight, whichever PackedLinear asks.  Each
# traced step (one per row count, decode/trace.py) wraps the model's layers in PackedLinears of its own, and
# a copy per wrapper would hold the weights once more for every trace kept.
_PACKED_COPIES = WeakIdKeyDictionary()


@functools.cache
def _traceable_product():
    """The same product as a TorchScript function, for decode/trace.py: the tracer cannot record the
    operator's empty `Scalar?[]` argument from Python, and TorchScript source can type it."""
    return torch.jit.CompilationUnit("""
def linear_pointwise(x: Tensor, packed_weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    scalars: List[Optional[number]] = []
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", scalars, "")
""").linear_pointwise


class PackedLinear(nn.Module):
    """`linear`'s weight and bias, multiplied on the CPU through a oneDNN-packed copy of the weight."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same parameter (a tied head stays tied)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.float32:
            return F.linear(x, self.weight, self.bias)  # the same product, with a backward and on any device
        parts = torch.get_num_threads()
        if x.numel() == self.in_features and parts > 1 and self.out_features % parts == 0:
            return self._one_row(x, parts)
        if torch.jit.is_tracing():
            return _traceable_product()(x, self.packed_weight(), self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight(), self.bias, "none", [], "")

    def _one_row(self, x: torch.Tensor, parts: int) -> torch.Tensor:
        """One row (a decoding step at batch 1) as a batched product over the weight cut into `parts` blocks of
        rows, one per thread: the product is bound by reading the weight, and each thread then streams a block of
        its own, where oneDNN's and MKL's one-row products leave part of the machine's read rate unused.  No copy:
        the blocks are a view of the weight."""
        blocks = self.weight.view(parts, self.out_features // parts, self.in_features)
        # (in, 1) as the transpose of a row: MKL reads these strides as a matrix-vector product it splits well; a
        # (1, in, 1) reshape gives the same values far more slowly.
        column = x.reshape(1, self.in_features).t().expand(parts, self.in_features, 1)
        if self.bias is None:
            out = torch.bmm(blocks, column)
        else:
            out = torch.baddbmm(self.bias.view(parts, -1, 1), blocks, column)
        return out.view(*x.shape[:-1], self.out_features)

    def packed_weight(self) -> torch.Tensor:
        # Repacked whenever the weight was replaced or changed in place since (a loaded state dict, an optimizer
        # step); a tensor made under inference mode has no version counter, and cannot be changed outside it.
        # The copy is kept beside the layer, not in it: an opaque oneDNN tensor can be neither copied nor pickled,
        # and a copy of the layer (copy.deepcopy, torch.save of a model) has a weight of its own to pack.
        version = None if torch.is_inference(self.weight) else self.weight._version
        kept = _PACKED_COPIES.get(self.weight)
        if kept is None or kept[0] != version:
            kept = _PACKED_COPIES[self.weight] = (
                version, torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None))
        return kept[1]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _float_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(name, m) for name, m in model.named_modules() if type(m) is not PackedLinear
            and isinstance(m, nn.Linear) and m.weight.dtype == torch.float32]


def _swap(model: nn.Module, name: str, layer: nn.Module) -> nn.Module:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    previous = getattr(parent, child)
    setattr(parent, child, layer)
    return previous


def pack_for_inference(model: nn.Module) -> str:
    """Swap every float nn.Linear of `model` (attention, MLP, the output head) for a PackedLinear, in place,
    when the model is float32 on a CPU whose PyTorch has oneDNN; returns one line saying what was done."""
    linears = _float_linears(model)
    if not linears:
        return "no float32 linear layers to pack"
    device = linears[0][1].weight.device
    if device.type != "cpu":
        return f"linear layers run as nn.Linear (packing is for the CPU; the model is on {device})"
    if not torch.backends.mkldnn.is_available():
        return "linear layers run as nn.Linear: this PyTorch build has no oneDNN to pack them for"
    for name, linear in linears:
        _swap(model, name, PackedLinear(linear))
    return f"{len(linears)} {PACKED}"


@contextlib.contextmanager
def packed_while(model: nn.Module):
    """`model` with its float32 CPU linears packed for the block's duration, then given back as it was: a trace
    made inside keeps the packed products and their packed weights, and the model itself is not changed."""
    linears = [(name, linear) for name, linear in _float_linears(model) if linear.weight.device.type == "cpu"]
    if not torch.backends.mkldnn.is_available():
        linears = []
    for name, linear in linears:
        _swap(model, name, PackedLinear(linear))
    try:
        yield
    finally:
        for name, linear in linears:
            _swap(model, name, linear)
