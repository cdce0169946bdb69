"""Decode steps run as one traced TorchScript graph: the CPU's counterpart of decode/cuda_graph.py.

At batch 1 on the CPU a GPT-2 124M decode step is ~150 small operators, and in eager PyTorch the Python between
them (module calls, argument checks, dispatch) is a large share of an int8 step, whose products read a quarter of
the fp32 step's weight bytes.
Traced once, the step runs in TorchScript's interpreter with no Python in between (bench/results/generate_speed.json
measures it against the eager steps, ONNX Runtime and llama.cpp). generate(decode="traced") and the server
(serve/engine.py) decode through it, and speculative decoding (decode/speculative.py) runs the target's check of a
few proposals and the draft's catch-up the same way: a step of W tokens per row.

The graph reads the cache through views that end at the new tokens' last column: every layer's keys and values
(rows, heads, keys, head size), into whose last W columns the step writes its own keys and values (or, for rows
at different lengths, the columns given for each row), then attends them (through a mask given as an input when
W > 1 or the rows differ). Nothing in the graph depends on the number of keys, so one trace serves every length,
and attention costs what the eager step's does (a graph over a fixed-size cache would attend every slot). It does
depend on the number of rows and tokens (nn.Linear's row count is read in Python), so a trace is kept per row
count and token count, with or without a mask and columns, dtype and device, and per weights: weights changed in
place since (a loaded state dict, an optimizer step) are traced anew.  It depends on the thread count too (each
float product's kernel, and how many blocks it cuts the weight into, is chosen for the count at the time), so
DecodeSteps has every trace made with the process's full count: a step that decode/step_threads.py runs with fewer
threads beside a busy program runs the same graph, where a trace made during a one-thread step would run every
later step with one thread's kernels (bench/by_hand.md, "auto's first trace in a fresh process").
tests/test_decode_trace.py checks the tokens against the eager steps.

Why TorchScript's tracer although torch 2.13 marks it deprecated: torch.compile (Inductor on the CPU) ran the
fp32 step slower than the eager steps (its matmuls were not the oneDNN-packed ones), and cannot trace fbgemm's
packed int8 weights (TorchScript objects) at all; torch is pinned.  bench/fused_decode_step.py compiles this step with
the packed products fixed in Inductor's graph, a trial that `python -m bench.experiments fused_step` times against
this one.
"""
from __future__ import annotations

import contextlib
import logging
import time
import warnings
import weakref
from dataclasses import dataclass, field

import torch

from decode.step_threads import use_threads
from model.gpt import GPT
from model.kv_cache import AttentionInputs, CacheWrites, KVCache, write_columns
from model.packed_linear import PackedLinear, choosing_kernels, confirm_kernels, packed_while
from runtime import huge_pages

log = logging.getLogger(__name__)

# Traces kept per model at the least (decode/steps.py keeps more for more rows): one per row count, width and
# placement a caller meets.
KEPT_TRACES = 8
# The traced steps a set of weights runs in a process before its weights are moved onto huge pages
# (runtime/huge_pages.py).  The pass makes every later step faster, but while it runs it slows the steps beside it,
# and a one-off call of a few hundred tokens ends before it is repaid (bench/by_hand.md, "huge pages for a one-off
# call"); a process that has run this many steps is one that keeps decoding.  The server starts the pass at once
# (serve/warm_up.py).
HUGE_PAGES_AFTER_STEPS = 512


@dataclass
class _WeightsRecord:
    """What this process keeps for a model's weights as they are: their traced steps, and how many ran."""
    weights: tuple  # the weights' versions (_weights_version)
    traces: dict = field(default_factory=dict)  # _key -> traced step
    steps_run: int = 0  # traced steps run with these weights
    passes_asked: int = 0  # huge-page passes asked for before a caller first made these weights' steps traceable


# model -> its record, replaced by a fresh one when its weights change (the old traces hold the old packed copies)
_RECORDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _CacheViews(CacheWrites):
    """One traced step's cache: the views of a cache's columns handed to the graph, into which the step writes its
    tokens' keys and values at the columns the attention inputs name, or else at their last W columns.  W is the
    trace's own token count, a plain number: the graph records the write as "the last W columns" (a negative start,
    counted from each call's end, so one trace serves every length) without reading any size as it runs.  The
    count of filled positions (and the overflow check) stays with the caller's KVCache, outside the graph."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], width: int):
        self.k, self.v, self.width = k, v, width

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, attention: AttentionInputs):
        if attention.columns is not None:
            write_columns(self.k[layer], attention.columns, k)
            write_columns(self.v[layer], attention.columns, v)
        else:
            self.k[layer].narrow(2, -self.width, self.width).copy_(k)
            self.v[layer].narrow(2, -self.width, self.width).copy_(v)
        return self.k[layer], self.v[layer]

    def advance(self, T: int) -> None:
        pass


class _DecodeStep(torch.nn.Module):
    """(tokens (B, W), positions (B, W), [mask (B or 1, 1, W, keys)], [columns (B, W)], every layer's keys, then
    values) -> logits (B, W, vocab)."""

    def __init__(self, model: GPT, masked: bool, placed: bool, width: int):
        super().__init__()
        self.masked, self.placed, self.width = masked, placed, width
        # The model is held outside the module tree, its tensors registered on this module itself: the tracer
        # makes a TorchScript module for every submodule it is given, which was most of a trace's time, and a
        # flat module whose state holds the very tensors the model reads traces the same graph.
        self.__dict__["model"] = model
        for i, tensor in enumerate(_unique(model.parameters())):
            self.register_parameter(f"parameter_{i}", tensor)
        for i, tensor in enumerate(_unique(model.buffers())):
            self.register_buffer(f"buffer_{i}", tensor, persistent=False)
        # Likewise the TorchScript objects a layer keeps as plain attributes (model/int8.py's packed int8 weights).
        script_objects = (value for m in model.modules() for value in vars(m).values()
                          if torch._C._jit_is_script_object(value))
        for i, value in enumerate(script_objects):
            setattr(self, f"script_object_{i}", value)

    def register_forms(self) -> None:
        """Register the derived weights the chosen kernels read (oneDNN-packed, transposed: copies outside the
        model's state, model/packed_linear.py), so that the trace reads them as its module's state rather than
        failing to embed them as constants."""
        forms = (form for m in self.model.modules() if isinstance(m, PackedLinear) for form in m.forms())
        for i, tensor in enumerate(_unique(forms)):
            self.register_buffer(f"form_{i}", tensor, persistent=False)

    def forward(self, tokens, positions, *tensors):
        mask, tensors = (tensors[0], tensors[1:]) if self.masked else (None, tensors)
        columns, keys_values = (tensors[0], tensors[1:]) if self.placed else (None, tensors)
        layers = len(keys_values) // 2
        cache = _CacheViews(list(keys_values[:layers]), list(keys_values[layers:]), self.width)
        return self.model(tokens, cache=cache, attention=AttentionInputs(positions, mask, columns))[0]


def _unique(tensors) -> list[torch.Tensor]:
    """Each tensor once (a tied head's weight is also the embedding's)."""
    return list({id(t): t for t in tensors}.values())


def _weights_version(model: GPT) -> tuple:
    """Which tensors the model holds, and how often each was changed in place. (A tensor made under inference
    mode has no version counter, and cannot be changed outside it; an id cannot come back while a trace holds
    the tensor it named.)"""
    return tuple((id(t), None if t.is_inference() else t._version) for t in (*model.parameters(), *model.buffers()))


def _trace(model: GPT, tokens: torch.Tensor, masked: bool, placed: bool,
           keys: list[torch.Tensor]) -> torch.jit.ScriptModule:
    # Tracing runs the step once, for real: on one more column of zeros than the step's tokens, so that the cache
    # is written only by the calls, and no copy of a long cache is made.
    (rows, width), device = tokens.shape, tokens.device
    sample = [torch.zeros(k.shape[:2] + (width + 1,) + k.shape[3:], dtype=k.dtype, device=device) for k in keys * 2]
    mask = [torch.ones(rows, 1, width, width + 1, dtype=torch.bool, device=device)] if masked else []
    columns = [torch.arange(1, width + 1, device=device).expand(rows, width)] if placed else []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*torch.jit")
        # Python values derived from shapes (nn.Linear's row count, say) become constants: by design, as each
        # trace serves one row count.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        # the trace multiplies through packed layers (each shape's kernel timed on this host), whether or not the
        # model does
        with packed_while(model):
            inputs = (tokens, torch.zeros_like(tokens), *mask, *columns, *sample)
            module = _DecodeStep(model, masked, placed, width)
            with choosing_kernels():  # one eager run first: each product's kernel is timed and chosen
                module(*inputs)
            confirm_kernels(lambda: module(*inputs))  # and the kernels it timed kept only if the step gains
            module.register_forms()
            step = torch.jit.trace(module, inputs, check_trace=False)
    # TorchScript's executor profiles a graph's first run and optimizes it at the second: one-time costs of the
    # trace, paid here so that they are timed with it and the caller's steps run the optimized graph.
    for _ in range(2):
        step(*inputs)
    return step


@contextlib.contextmanager
def _thread_count(count: int | None):
    """Within the block, `count` threads (None: as set); the count as it was after it."""
    before = torch.get_num_threads()
    if count is not None:
        use_threads(count)
    try:
        yield
    finally:
        use_threads(before)


def _key(tokens: torch.Tensor, mask: torch.Tensor | None, columns: torch.Tensor | None, dtype: torch.dtype) -> tuple:
    """What a trace is kept by: all it depends on beside the weights."""
    return *tokens.shape, mask is not None, columns is not None, dtype, tokens.device


class TracedSteps:
    """The traced decode steps of `model` as its weights are now, made on first use for each row count, token
    count (and mask or none), at most `kept` of them (the oldest goes first), and kept with the model for later
    instances while its weights stay the same. Weights changed after an instance is made are not seen by it:
    checking walks every parameter, which is done once, not at every step."""

    def __init__(self, model: GPT, kept: int = KEPT_TRACES, threads: int | None = None):
        """`threads`: the thread count every trace is made with, whatever count is set when it is made (None: that
        one)."""
        self.kept, self.threads = kept, threads
        self.setup_s = 0.0  # seconds this instance spent making traces (each with its first runs)
        weights = _weights_version(model)
        record = _RECORDS.get(model)
        if record is None or record.weights != weights:
            record = _RECORDS[model] = _WeightsRecord(weights, passes_asked=huge_pages.passes_asked())
        self.model, self.record = model, record

    @property
    def traces(self) -> dict:
        """The traced steps kept for the model's weights (shared with every instance made for the same weights)."""
        return self.record.traces

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                 keys: list[torch.Tensor], values: list[torch.Tensor],
                 columns: torch.Tensor | None = None) -> torch.Tensor:
        """The logits (B, W, vocab) of `model(tokens, ...)` for W tokens per row, run as a traced graph.

        `keys` and `values`: each layer's (B, heads, n, head size) views of a cache, whose first n - W columns
        hold the rows' earlier keys and values and whose last W columns the step fills with the new tokens'
        (or, given `columns` (B, W), the columns it names in each row); `positions` (B, W): each token's
        position; `mask` (B or 1, 1, W, n), True where a token may attend a column (its own included), or None to
        attend all n (one token per row, written to the last column, only).
        """
        key = _key(tokens, mask, columns, keys[0].dtype)
        step = self.traces.get(key)
        if step is None:
            while len(self.traces) >= self.kept:
                del self.traces[next(iter(self.traces))]  # the oldest
            started = time.perf_counter()
            with _thread_count(self.threads):
                step = self.traces[key] = _trace(self.model, tokens, mask is not None, columns is not None, keys)
            seconds = time.perf_counter() - started
            self.setup_s += seconds
            log.info("traced the decode step for %d row(s) of %d token(s)%s%s in %.2fs", *tokens.shape,
                     " with a mask" if mask is not None else "",
                     " at each row's own columns" if columns is not None else "", seconds)
        self._count_step()
        return step(tokens, positions, *([] if mask is None else [mask]), *([] if columns is None else [columns]),
                    *keys, *values)

    def _count_step(self) -> None:
        """Start the huge-page pass once these weights have run HUGE_PAGES_AFTER_STEPS traced steps, unless one was
        asked for since their steps were first made traceable (a server's warm-up, a benchmark's, asks at once,
        whether or not `auto` traced yet): one pass per set of weights (their packed copies exist from the first
        trace on, and later traces share them), so that none runs (and contends for the process's memory map)
        under load."""
        record = self.record
        if _RECORDS.get(self.model) is not record:  # weights changed since this instance was made: not theirs
            return
        record.steps_run += 1
        if record.steps_run == HUGE_PAGES_AFTER_STEPS and huge_pages.passes_asked() == record.passes_asked:
            log.info("%s", huge_pages.collapse_in_background())

    def key_for(self, cache: KVCache, tokens: torch.Tensor) -> tuple:
        """What the step of `tokens` over `cache` is traced (and timed, decode/trace_payback.py) by."""
        attention = cache.attention_inputs(tokens.size(1))
        return _key(tokens, attention.mask, attention.columns, cache.k[0].dtype)

    def kept_for(self, cache: KVCache, tokens: torch.Tensor) -> bool:
        """Whether the step of `tokens` over `cache` has its trace made already (so that running it traced costs
        no trace)."""
        return self.key_for(cache, tokens) in self.traces

    def step(self, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
        """`model(tokens, cache=cache)[0]` for (B, W) tokens, each row's from its own length on."""
        width = tokens.size(1)
        cache.check_room(width)
        end = cache.length + width
        keys, values = [k[:, :, :end] for k in cache.k], [v[:, :, :end] for v in cache.v]
        attention = cache.attention_inputs(width)
        logits = self(tokens, attention.positions.expand_as(tokens), attention.mask, keys, values,
                      columns=attention.columns)
        cache.advance(width)
        return logits
