"""Float linear layers for inference on the CPU, each product run by the kernel timed fastest for its shape on this
host.

A decoding step multiplies each weight matrix by a few rows (one per sequence), so it is bound by reading the
weights from memory, and which kernel reads them fastest depends on the host and the row count: on one 2-core
EPYC, MKL's one-row product ran on one of the two cores, oneDNN's product over a weight packed ahead of time read
GPT-2 124M's matrices faster, and a batched product over the weight cut into one block of rows per thread faster
still at one row; on a slower host ONNX Runtime's products (MLAS: the columns split across threads) kept up with
more rows where oneDNN's did not.  So the kernel of each shape (rows, in, out, threads) is chosen by timing the
candidates (`KERNELS`) on this host when a decode step is traced (decode/trace.py), once per host: the choice is
kept for later processes (model/kernel_choice.py), whose eager steps run it too; a shape no trace on this host has
timed runs the default rule (`default_kernel`).
How the products compare per host: bench/standalone/decode_profile.py, and the whole step against ONNX Runtime and llama.cpp:
bench/experiments/generate_speed.py.  The copies a kernel reads (oneDNN's packed weight, a transposed one) are
derived and never saved: the module keeps the original parameter, so a tied head stays tied and checkpoints,
exports and state dicts are unchanged.

`pack_for_inference(model)` swaps the layers in place and says what it did; sample.py, the server, the
scorecard and the speed benchmarks call it. Training and anything that needs gradients keep nn.Linear's
product (the packed one has no backward), and so do other devices and dtypes.
"""
from __future__ import annotations

import contextlib
import functools
import math
import threading

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from model.kernel_choice import KernelChoices, kept_choices_from_environment


# What pack_for_inference says it did, after the count of layers.
PACKED = ("linear layers packed for oneDNN (float32, CPU; each decode step's shape runs the product timed fastest "
          "on this host when traced)")

# The products a PackedLinear can run, each `x @ weight.T + bias` over a form of the weight: oneDNN's product over
# its packed copy; torch's `linear` (MKL, the weight as it is); `transposed`, a plain product over a (in, out)
# copy; `blocked`, the weight's rows cut into one block per thread, each thread streaming a block of its own (a
# view, no copy); `blocked_t`, the same blocks transposed into (in, out / threads) panels, as ONNX Runtime's MLAS
# splits a skinny product's columns across its threads over a weight packed in column panels.
KERNELS = ("onednn", "linear", "transposed", "blocked", "blocked_t")
# Bytes of weights each candidate reads per timed round when a shape's kernel is chosen (several layers' weights
# of that shape in turn, at least one): more than a cache holds, so that each product reads its weight from
# memory, as every product of a decode step does.
MEASURED_BYTES = 48 * 2**20

# weight -> {form: (the weight's version when made, the derived copy)}: one copy per weight and form, whichever
# PackedLinear asks.  Each traced step (one per row count, decode/trace.py) wraps the model's layers in
# PackedLinears of its own, and a copy per wrapper would hold the weights once more for every trace kept.
_FORMS = WeakIdKeyDictionary()
# (in, out, bias or not) -> {weight: bias} of every PackedLinear made: the weights a shape's timing reads in turn.
_BY_SHAPE: dict[tuple[int, int, bool], WeakIdKeyDictionary] = {}
# The kernel per (rows, in, out, bias or not, threads), for the process's life and kept for the next ones.
CHOICES = KernelChoices(kept=kept_choices_from_environment())
_choosing = threading.local()


@contextlib.contextmanager
def choosing_kernels():
    """Within the block, a product at a shape with no kernel chosen yet times the candidates and keeps the fastest
    (decode/trace.py runs a step once so, before tracing it); elsewhere such a shape runs the default rule
    (`default_kernel`), as timing the candidates costs many products: paid once per shape by a trace, whose cost
    decides whether a call traces at all (decode/trace_payback.py)."""
    before = getattr(_choosing, "on", False)
    _choosing.on = True
    try:
        yield
    finally:
        _choosing.on = before


def confirm_kernels(step) -> None:
    """After `step` (a whole decode step) ran under `choosing_kernels`: keep the kernels it timed only if the step
    runs faster with them than with the default rule (model/kernel_choice.py's `confirm`), and free the copies that
    no kernel kept reads."""
    judged = CHOICES.confirm(step, lambda shape: default_kernel(shape[0], shape[2], shape[-1]))
    for shape in {chosen[1:4] for chosen in judged}:
        _drop_unchosen_forms(shape)


def default_kernel(rows: int, out_features: int, parts: int) -> str:
    """The kernel of a shape not timed: a thread's block of weight rows for one row (a decoding step at batch 1),
    which streamed the weight faster than either library's one-row product on the hosts measured; else oneDNN's."""
    return "blocked" if rows == 1 and _splits(out_features, parts) else "onednn"


def _splits(out_features: int, parts: int) -> bool:
    return parts > 1 and out_features % parts == 0


@functools.cache
def _traceable_product():
    """oneDNN's product as a TorchScript function, for decode/trace.py: the tracer cannot record the operator's
    empty `Scalar?[]` argument from Python, and TorchScript source can type it."""
    return torch.jit.CompilationUnit("""
def linear_pointwise(x: Tensor, packed_weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    scalars: List[Optional[number]] = []
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", scalars, "")
""").linear_pointwise


def _form_key(kernel: str, parts: int):
    """The derived copy of the weight that `kernel` reads (None: the weight itself)."""
    return {"onednn": "onednn", "transposed": "transposed", "blocked_t": ("blocked_t", parts)}.get(kernel)


def _make_form(weight: torch.Tensor, form) -> torch.Tensor:
    weight = weight.detach()
    if form == "onednn":
        return torch.ops.mkldnn._reorder_linear_weight(weight, None)
    if form == "transposed":
        return weight.t().contiguous()
    _, parts = form  # blocked_t: (parts, in, out / parts), each thread's panel contiguous
    return weight.view(parts, weight.size(0) // parts, weight.size(1)).transpose(1, 2).contiguous()


def weight_form(weight: torch.Tensor, form) -> torch.Tensor:
    """The derived copy `form` of `weight`, made again whenever the weight was replaced or changed in place since
    (a loaded state dict, an optimizer step); a tensor made under inference mode has no version counter, and
    cannot be changed outside it.  The copies are kept beside the layer, not in it: an opaque oneDNN tensor can be
    neither copied nor pickled, and a copy of the layer (copy.deepcopy, torch.save of a model) has a weight of its
    own."""
    version = None if torch.is_inference(weight) else weight._version
    forms = _FORMS.setdefault(weight, {})
    kept = forms.get(form)
    if kept is None or kept[0] != version:
        kept = forms[form] = (version, _make_form(weight, form))
    return kept[1]


def kernel_form(weight: torch.Tensor, kernel: str, parts: int) -> torch.Tensor:
    """What `kernel` reads of `weight` with `parts` threads: its derived copy (`weight_form`), or the weight itself."""
    form = _form_key(kernel, parts)
    return weight if form is None else weight_form(weight, form)


def product(kernel: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, parts: int
            ) -> torch.Tensor:
    """`x @ weight.T + bias` for x (..., in) through `kernel` (KERNELS), `parts` threads' blocks for the blocked
    ones."""
    return product_over(kernel, x, weight, kernel_form(weight, kernel, parts), bias, parts)


def product_over(kernel: str, x: torch.Tensor, weight: torch.Tensor, form: torch.Tensor, bias: torch.Tensor | None,
                 parts: int) -> torch.Tensor:
    """`product` with the weight's form given (`kernel_form`): a compiled step (bench/fused_decode_step.py) holds its
    forms as state, as its compiler cannot follow the lookup of a kept copy."""
    if kernel == "linear":
        return F.linear(x, weight, bias)
    if kernel == "onednn":
        if torch.jit.is_tracing():
            return _traceable_product()(x, form, bias)
        return torch.ops.mkldnn._linear_pointwise(x, form, bias, "none", [], "")
    # Plain numbers, read once: a trace (one row count each) then runs no size lookups for this product.
    out_features, in_features = (int(size) for size in weight.shape)
    leading = [int(size) for size in x.shape[:-1]]
    rows = math.prod(leading)
    # (in, rows) as the transpose of the rows: MKL reads these strides as matrix-vector products it splits well; a
    # (1, in, 1) reshape of one row gave the same values far more slowly.
    x2 = x.reshape(rows, in_features)
    if kernel == "transposed":
        out = torch.mm(x2, form) if bias is None else torch.addmm(bias, x2, form)
    elif kernel == "blocked":
        blocks = weight.view(parts, out_features // parts, in_features)
        columns = x2.t().expand(parts, in_features, rows)
        out = torch.bmm(blocks, columns) if bias is None else torch.baddbmm(bias.view(parts, -1, 1), blocks, columns)
        # contiguous, as the other kernels' outputs are: the step's next operators ran slower over the transpose
        out = out.view(out_features, rows).t().contiguous()
    elif kernel == "blocked_t":
        rows_each = x2.expand(parts, rows, in_features)
        out = torch.bmm(rows_each, form) if bias is None else torch.baddbmm(bias.view(parts, 1, -1), rows_each,
                                                                            form)
        out = out.transpose(0, 1).reshape(rows, out_features)
    else:
        raise ValueError(f"unknown kernel {kernel!r}; the kernels are {KERNELS}")
    return out.reshape(*leading, out_features)


class PackedLinear(nn.Module):
    """`linear`'s weight and bias, multiplied on the CPU through the kernel chosen for each shape (`KERNELS`)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same parameter (a tied head stays tied)
        self.bias = linear.bias
        _BY_SHAPE.setdefault(self._shape(), WeakIdKeyDictionary())[self.weight] = self.bias

    def _shape(self) -> tuple[int, int, bool]:
        return self.in_features, self.out_features, self.bias is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.float32:
            return F.linear(x, self.weight, self.bias)  # the same product, with a backward and on any device
        parts = torch.get_num_threads()
        rows = int(math.prod(x.shape[:-1]))  # while tracing, sizes are tensors: a trace serves one row count
        return product(self.kernel(rows, parts), x, self.weight, self.bias, parts)

    def kernel(self, rows: int, parts: int) -> str:
        """The kernel this layer runs for `rows` rows with `parts` threads: the one chosen for the shape, timed now
        within `choosing_kernels`, else what an earlier process's trace chose here, else the default rule."""
        shape = (rows, *self._shape(), parts)
        kernel = CHOICES.chosen.get(shape)
        if kernel is None:
            if getattr(_choosing, "on", False):
                kernel = CHOICES.choose(shape, lambda: self._candidates(rows, parts))
                _drop_unchosen_forms(self._shape())
            else:  # what an earlier process's trace chose here, if any: a fixed rule is wrong on some hosts
                kernel = (CHOICES.known(shape, lambda name: name in self._kernels(parts))
                          or default_kernel(rows, self.out_features, parts))
        return kernel

    def timed_weights(self) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """The (weight, bias) pairs a candidate's timed round runs over: this layer's and others of its shape, as
        many as fill MEASURED_BYTES (at least this one)."""
        siblings = [(self.weight, self.bias)] + [(w, b) for w, b in _BY_SHAPE[self._shape()].items()
                                                 if w is not self.weight]
        each = self.weight.numel() * self.weight.element_size()
        return siblings[:max(1, MEASURED_BYTES // each)]

    def _candidates(self, rows: int, parts: int) -> dict:
        """Each kernel that fits, as a call running it over `timed_weights` in turn, on rows of random values (the
        values do not change a product's time)."""
        weights = self.timed_weights()
        x = torch.randn(rows, self.in_features)
        return {k: functools.partial(_over, k, x, weights, parts) for k in self._kernels(parts)}

    def _kernels(self, parts: int) -> list[str]:
        """The kernels that fit this layer with `parts` threads (the blocked ones need the rows to split evenly)."""
        return [k for k in KERNELS if _splits(self.out_features, parts) or not k.startswith("blocked")]

    def forms(self) -> list[torch.Tensor]:
        """The derived copies of the weight kept now (those the chosen kernels read): a trace holds them as its
        state."""
        return [tensor for _, tensor in _FORMS.get(self.weight, {}).values()]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _over(kernel: str, x: torch.Tensor, weights: list, parts: int) -> None:
    for weight, bias in weights:
        product(kernel, x, weight, bias, parts)


def _drop_unchosen_forms(shape: tuple[int, int, bool]) -> None:
    """Free the derived copies that timing made and no kernel chosen for a layer of `shape` reads (a trace made
    already keeps those it holds)."""
    # oneDNN's packed copy stays: the default kernel of most shapes not timed (a prompt's pass) reads it.
    needed = {"onednn"} | {_form_key(kernel, chosen[-1]) for chosen, kernel in CHOICES.chosen.items()
                           if chosen[1:4] == shape}
    for weight in _BY_SHAPE.get(shape, {}).keys():
        forms = _FORMS.get(weight, {})
        for form in [f for f in forms if f not in needed]:
            del forms[form]


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
