"""Decode steps run as one traced TorchScript graph: the CPU's counterpart of model/decode_graph.py.

At batch 1 on the CPU a GPT-2 124M decode step is ~150 small operators, and in eager PyTorch the Python between
them (module calls, argument checks, dispatch) is a large share of an int8 step, whose products read only 125 MB.
Traced once, the step runs in TorchScript's interpreter with no Python in between: at batch 1, 1.38x the eager
int8 decoding and 1.06x the eager fp32 decoding on a 2-core AMD EPYC, same tokens; at batch 12, where the
products dominate, attention over every slot of the static cache makes it 0.93-0.95x
(bench/results/generate_speed.json, which measures it beside ONNX Runtime and llama.cpp).

Why TorchScript's tracer although torch 2.13 marks it deprecated: torch.compile (Inductor on the CPU) ran the
fp32 step at half the eager speed (its matmuls are not the oneDNN-packed ones), and cannot trace fbgemm's
packed int8 weights (TorchScript objects) at all; torch is pinned, and the trace is checked against eager
decoding by tests/test_decode_trace.py.

The step needs fixed shapes, which a StaticKVCache gives: its tensors are the trace's inputs (so one trace
serves every cache of the same shape), the write position is a tensor the step advances itself, and attention
reads every slot through a mask. The Python-side count of filled positions is kept here, outside the graph.
A trace is kept per model, batch size, cache length and weights: decoding again with the same shapes reuses
it, and weights changed in place since (a loaded state dict, an optimizer step) are traced anew.
"""
from __future__ import annotations

import warnings
import weakref

import torch

from model.gpt import GPT, StaticKVCache
from model.packed_linear import PackedLinear

# model -> (its weights' versions, {(batch, cache length, dtype, device): traced step})
_TRACES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
KEPT_SHAPES = 4  # sample.py's batches of prompts of similar lengths share a few (generate() rounds cache lengths)
CACHE_LENGTH_MULTIPLE = 64


class _CacheTensors(StaticKVCache):
    """A StaticKVCache's arithmetic over tensors handed to the traced step; the Python-side length (and its
    overflow check) stays with TracedDecoder, outside the graph."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], position: torch.Tensor, slots: torch.Tensor):
        self.k, self.v, self.position, self.slots = k, v, position, slots
        self.max_len, self.length = slots.numel(), 0

    def check_room(self, T: int) -> None:
        pass  # TracedDecoder checks the real cache before every call

    def advance(self, T: int) -> None:
        self.position.add_(T)


class _DecodeStep(torch.nn.Module):
    """(tokens (B, 1), write position, slot indices, every layer's keys, then values) -> last logits."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model
        # The oneDNN-packed weights are derived copies outside the model's state; registered here, the trace
        # reads them as its module's state rather than failing to embed them as constants.
        for i, layer in enumerate(m for m in model.modules() if isinstance(m, PackedLinear)):
            self.register_buffer(f"packed_{i}", layer.packed_weight(), persistent=False)

    def forward(self, tokens, position, slots, *keys_values):
        layers = len(keys_values) // 2
        cache = _CacheTensors(list(keys_values[:layers]), list(keys_values[layers:]), position, slots)
        return self.model(tokens, cache=cache, last_only=True)[0]


def _weights_version(model: GPT) -> tuple:
    """Which tensors the model holds, and how often each was changed in place. (A tensor made under inference
    mode has no version counter, and cannot be changed outside it; an id cannot come back while a trace holds
    the tensor it named.)"""
    return tuple((id(t), None if t.is_inference() else t._version) for t in (*model.parameters(), *model.buffers()))


class TracedDecoder:
    """Callable like `model(tokens, cache=cache, last_only=True)[0]` for (B, 1) tokens, one step at a time,
    once the cache holds the prompt."""

    def __init__(self, model: GPT, cache: StaticKVCache):
        self.model, self.cache = model, cache
        self.inputs = (cache.position, cache.slots, *cache.k, *cache.v)
        self.step: torch.jit.ScriptModule | None = None  # looked up at the first call (the weights are fixed by then)

    def _traced(self, tokens: torch.Tensor) -> torch.jit.ScriptModule:
        weights = _weights_version(self.model)
        key = (tokens.size(0), self.cache.max_len, self.cache.k[0].dtype, tokens.device)
        kept_weights, traces = _TRACES.get(self.model, (None, {}))
        if kept_weights != weights:  # traced for weights since changed: each holds their packed copies
            traces = {}
        _TRACES[self.model] = weights, traces
        if key not in traces:
            if len(traces) == KEPT_SHAPES:
                del traces[next(iter(traces))]  # the oldest
            # Tracing runs the step once, for real: on copies, so that the cache is written only by the calls.
            sample = (self.cache.position.clone(), self.cache.slots,
                      *(t.clone() for t in (*self.cache.k, *self.cache.v)))
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*torch.jit")
                # Python values derived from shapes (nn.Linear's row count, say) become constants: by design, as
                # each trace serves one shape.
                warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
                traces[key] = torch.jit.trace(_DecodeStep(self.model), (tokens, *sample), check_trace=False)
        return traces[key]

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        self.cache.check_room(tokens.size(1))
        if self.step is None:
            self.step = self._traced(tokens)
        logits = self.step(tokens, *self.inputs)
        self.cache.length += tokens.size(1)
        return logits
