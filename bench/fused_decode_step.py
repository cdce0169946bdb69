"""A trial (issue 70, item 3): the traced decode step (decode/trace.py) compiled by TorchInductor instead, with the
small operators between its products (layer norms, GELU, residual adds, views) fused into C++ loops.

About a fifth of a traced fp32 step at batch 1 is those small operators, each a pass over a few kilobytes that
TorchScript's interpreter runs one by one; ONNX Runtime fuses them.  Inductor with its CPU inference settings
(`freezing`: the weights become constants of the graph; `cpp_wrapper`: the graph runs as C++, without Python between
its kernels) fuses them around the products.  The products stay today's: each packed layer's kernel for the step's
shape (model/packed_linear.py: oneDNN's product over its packed copy, the thread-blocked product, ...) is chosen as
the trace chooses it, then fixed in a copy of the model's module tree (`FixedProduct`), as Inductor cannot follow
PackedLinear's choice at run time (its thread count and its lookups break the graph).  oneDNN's product sits in the
graph as an operator over its packed weight (an opaque tensor Inductor keeps as a constant).

The step is the traced one's: one token per row, every row at the same length, over views of the KV cache that end
at the new token's column (the length marked dynamic, so one compile serves every length), its keys and values
written into the last column.  A compiled step is kept per row count; it is made for one cache size (its views'
strides), and a cache of another size compiles it again.  Inductor keeps its compiled code on disk, in
$TORCHINDUCTOR_CACHE_DIR, which this module sets to the project's .cache/inductor when it is not set: a later
process with the same graph loads Inductor's code rather than generating and compiling it again, but still runs
Dynamo's capture, AOTAutograd and the freezing passes, most of a compile's time (`inductor_cache`).

`python -m bench.experiments fused_step` times the compile, the second process's and the step against the traced
one.  On a quiet 2-core host (bench/results/fused_step.json) it was a few percent faster at batch 1 and a few
percent slower at batches 4 and 12, for a compile of tens of seconds that a second process paid again: so it lives
here, as the benchmark's trial, and is no decode mode (decode/steps.py).
"""
from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import torch
import torch.nn as nn

from decode.trace import _DecodeStep
from model.gpt import GPT
from model.kv_cache import KVCache
from model.packed_linear import PackedLinear, choosing_kernels, confirm_kernels, kernel_form, packed_while, \
    product_over
from runtime.kept_file import CACHE_FOLDER

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
DEFAULT_CACHE = CACHE_FOLDER / "inductor"
# Inductor's settings for CPU inference, as its CPU tutorials give them.  Set around every call of a compiled step,
# not passed as torch.compile's options: Dynamo reads `freezing` as it captures the graph (whether the weights stay
# attributes, to be folded in as constants), outside the options' reach, and without it oneDNN's product over its
# packed weight fails to compile (Inductor asserts that weight is a constant).  The call's whole cost, a few tens
# of microseconds, is timed with the step.
COMPILE_OPTIONS = {"freezing": True, "cpp_wrapper": True}


def inductor_cache() -> Path:
    """The folder Inductor keeps its compiled code in: $TORCHINDUCTOR_CACHE_DIR, set to the project's .cache/inductor
    for this process (and those it starts) unless it names another folder than Inductor's default (importing
    torch._dynamo or torch._inductor sets the variable to that default, /tmp/torchinductor_USER, so a value equal
    to it was most likely not the user's)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    given = os.environ.get(CACHE_ENV)
    if given is None or os.path.abspath(given) == os.path.abspath(default_cache_dir()):
        os.environ[CACHE_ENV] = str(DEFAULT_CACHE)
    return Path(os.environ[CACHE_ENV])


class FixedProduct(nn.Module):
    """A packed layer's product through one kernel, fixed: the one its shape runs in a traced step."""

    def __init__(self, layer: PackedLinear, kernel: str, parts: int):
        super().__init__()
        self.kernel, self.parts = kernel, parts
        self.weight, self.bias = layer.weight, layer.bias  # the model's own parameters
        form = kernel_form(layer.weight, kernel, parts)
        # the derived copy (oneDNN's packed weight, a transposed one); None where the kernel reads the weight itself
        self.form = None if form is layer.weight else form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        form = self.weight if self.form is None else self.form
        return product_over(self.kernel, x, self.weight, form, self.bias, self.parts)


def fixed_copy(model: GPT, rows: int, parts: int) -> GPT:
    """A copy of `model`'s module tree sharing its tensors, each PackedLinear replaced by its FixedProduct for one
    token in each of `rows` rows and `parts` threads."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    fixed = copy.deepcopy(model, memo=shared)
    packed = [(name, m) for name, m in fixed.named_modules() if isinstance(m, PackedLinear)]
    for name, layer in packed:
        parent_name, _, child = name.rpartition(".")
        parent = fixed.get_submodule(parent_name) if parent_name else fixed
        setattr(parent, child, FixedProduct(layer, layer.kernel(rows, parts), parts))
    return fixed


class FusedSteps:
    """`model`'s one-token decode steps (every row at the same length), compiled by Inductor per row count on first
    use.  The weights must stay as they are while the steps are used (the compiled graph holds them as constants)."""

    def __init__(self, model: GPT):
        # (an int8 model's weights are int8 buffers, read by fbgemm's products: the traced step runs those)
        if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in (*model.parameters(), *model.buffers())):
            raise ValueError("the fused step is for a float32 model on the CPU; run the traced step (decode "
                             "'traced') for other models")
        self.model = model
        self.compiled: dict[int, nn.Module] = {}  # rows -> its compiled step
        self.setup_s = 0.0  # seconds spent choosing kernels, compiling and in the first runs

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, keys: list[torch.Tensor],
                 values: list[torch.Tensor]) -> torch.Tensor:
        """The logits (B, 1, vocab) of one token per row, as TracedSteps's call without a mask or columns."""
        from torch._inductor import config as inductor_config  # here: importing it sets $TORCHINDUCTOR_CACHE_DIR
        # freezing folds the weights only in a graph without gradients
        with torch.no_grad(), inductor_config.patch(COMPILE_OPTIONS):
            return self._call(tokens, positions, keys, values)

    def _call(self, tokens, positions, keys, values) -> torch.Tensor:
        rows = tokens.size(0)
        step = self.compiled.get(rows)
        if step is not None:
            return step(tokens, positions, *keys, *values)
        # The first call compiles, on the caller's own views: Inductor's graph is made for their strides (those of
        # the cache's layout), and for any length, marked dynamic.
        started = time.perf_counter()
        step = self.compiled[rows] = self._compiled(tokens, keys)
        for tensor in (*keys, *values):
            torch._dynamo.mark_dynamic(tensor, 2)
        logits = step(tokens, positions, *keys, *values)
        self.setup_s += time.perf_counter() - started
        return logits

    def _compiled(self, tokens: torch.Tensor, keys: list[torch.Tensor]) -> nn.Module:
        """The step for `tokens`' row count, to be compiled at its first call."""
        inductor_cache()
        rows, parts = tokens.size(0), torch.get_num_threads()
        # the kernels timed on a cache of their own: columns of zeros, the caller's cache untouched
        sample = [torch.zeros(k.shape[:2] + (2,) + k.shape[3:], dtype=k.dtype) for k in keys * 2]
        inputs = (tokens, torch.ones_like(tokens), *sample)
        with packed_while(self.model):  # the products chosen as a trace chooses them (decode/trace.py)
            chosen = _DecodeStep(self.model, masked=False, placed=False, width=1)
            with choosing_kernels():
                chosen(*inputs)
            confirm_kernels(lambda: chosen(*inputs))
            fixed = fixed_copy(self.model, rows, parts)
        return torch.compile(_DecodeStep(fixed, masked=False, placed=False, width=1), )

    def step(self, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
        """`model(tokens, cache=cache)[0]` for (B, 1) tokens over a cache whose rows hold the same number."""
        if tokens.size(1) != 1 or not cache.aligned:
            raise ValueError("the fused step runs one token per row, every row at the same length")
        cache.check_room(1)
        end = cache.length + 1
        keys, values = [k[:, :, :end] for k in cache.k], [v[:, :, :end] for v in cache.v]
        logits = self(tokens, torch.full_like(tokens, cache.length), keys, values)
        cache.advance(1)
        return logits
