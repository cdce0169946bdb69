"""How a model's forward passes over a KV cache run, chosen once by a decode mode: the one step runner behind
generate()'s plain and speculative loops (decode/generate.py, decode/speculative.py) and the server's running batch
(serve/engine.py).  Each asks `DecodeSteps.logits` for the logits of a few new tokens per row; the mode decides
whether that pass runs eagerly, as a traced TorchScript graph (decode/trace.py) or as a captured CUDA graph
(decode/cuda_graph.py), and which cache layout it needs (model/kv_cache.py).  The tokens are the same in every
mode.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from decode.cuda_graph import CapturedSteps
from decode.trace import KEPT_TRACES, TracedSteps
from decode import trace_payback
from model.gpt import GPT
from model.kv_cache import KVCache, StaticKVCache
from decode.step_threads import StepThreads

# auto: the fastest for the model and device (fastest_decode); dynamic: eager passes over the filled columns of the
# cache (the fastest eager steps); static: eager passes over fixed shapes, every column attended through a mask
# (what a CUDA graph needs); cuda-graph: static, each step after the prompt replayed as a captured CUDA graph;
# traced: dynamic, each step after the prompt one traced TorchScript graph, without Python between its operators.
DECODE_MODES = ("auto", "dynamic", "static", "cuda-graph", "traced")


def fastest_decode(model: torch.nn.Module, device: torch.device, speculative: bool = False) -> str:
    """What `auto` runs for `model` on `device`.  CPU: the traced steps, whose graph multiplies through
    oneDNN-packed weights, the fastest path measured there (`python -m bench.experiments generate_speed`).  CUDA:
    one captured graph per step (the same experiment times it against eager steps on a CUDA machine, into
    bench/results/gpu/); speculative passes (whose row counts and widths change from step to step, each
    needing a capture of its own) run eagerly there, as no GPU has measured them captured.  Eager steps elsewhere,
    in a process group of several ranks (a sharded model's collectives can be neither traced nor captured), and
    for a model with a layer that says the tracer cannot record it (`traceable = False`, as prune/csr.py's sparse
    products do)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1:
        return "dynamic"
    if not all(getattr(m, "traceable", True) for m in model.modules()):
        return "dynamic"
    fastest = {"cpu": "traced", "cuda": "dynamic" if speculative else "cuda-graph"}
    return fastest.get(device.type, "dynamic")


def cache_dtype(model: torch.nn.Module) -> torch.dtype:
    """The KV cache's dtype: that of the model's float weights (an int8 model keeps float norms and embeddings,
    and computes in float32)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


@dataclass(frozen=True)
class _Judged:
    """Auto's way for one step after the prompt, and what its time is noted under (decode/trace_payback.py)."""
    traced: bool
    kept: bool  # whether the trace was made already
    shape: tuple


class DecodeSteps:
    """`model`'s passes over its KV caches on `device` under `decode` (DECODE_MODES), for up to `max_rows` rows at
    once.  A traced step is kept per row count, token count and placement (rows aligned or not), so 4 x max_rows
    of them (at least KEPT_TRACES); the weights must stay as they are while the steps are used (traces hold packed copies)."""

    def __init__(self, model: GPT, device: torch.device, decode: str = "auto", max_rows: int = 1,
                 speculative: bool = False):
        if decode not in DECODE_MODES:
            raise ValueError(f"decode {decode!r} is not one of {DECODE_MODES}")
        self.mode = fastest_decode(model, device, speculative) if decode == "auto" else decode
        if self.mode == "cuda-graph" and device.type != "cuda":
            raise ValueError(f"decode 'cuda-graph' needs a CUDA device; the model is on {device}")
        self.model, self.device = model, device
        # An explicit `traced` traces every step; auto traces when the tokens a call has left will repay the trace,
        # as this process's timings on this host say (decode/trace_payback.py).
        self.trace_when_repaid = decode == "auto"
        # On the CPU, each step after the prompt runs with the threads other programs leave free, which stay set
        # between steps until `release_threads`; traces are made with all the threads (decode/trace.py).
        self.threads = StepThreads() if device.type == "cpu" else None
        self.traced = (TracedSteps(model, max(KEPT_TRACES, 4 * max_rows), self.threads and self.threads.most)
                       if self.mode == "traced" else None)
        self.captured = CapturedSteps(model) if self.mode == "cuda-graph" else None
        self._eager_before: dict[tuple, int] = {}  # per step shape, for auto's trace decision

    @property
    def compiled(self) -> bool:
        """Whether the steps after the prompt run as graphs made for each row count (traced or captured): worth
        padding a batch to fewer row counts."""
        return self.traced is not None or self.captured is not None

    @property
    def setup_s(self) -> float:
        """Seconds of one-time set-up these steps spent so far: the traces they made, with their first runs."""
        return self.traced.setup_s if self.traced is not None else 0.0

    def new_cache(self, rows: int, max_len: int) -> KVCache:
        """An empty cache of the layout this mode's steps need."""
        layout = StaticKVCache if self.mode in ("static", "cuda-graph") else KVCache
        return layout.allocate(self.model.config, rows, max_len, self.device, cache_dtype(self.model))

    def logits(self, cache: KVCache, inputs: torch.Tensor, positions: int, tokens_left: int | None = None
               ) -> torch.Tensor:
        """The model's logits (rows, positions, vocab) at the last `positions` of `inputs` (rows, W), fed into
        `cache` after each row's tokens.  The prompt (an empty cache) runs as one eager pass; the steps after it
        (a few tokens per row) run as the mode says.  `tokens_left`: how many steps the caller has yet to run,
        this one included, for auto to judge whether a trace would be repaid (None: as many as will come, as for
        the server, whose traces serve its whole life)."""
        judged = self._judge(cache, inputs, tokens_left)
        if cache.length > 0 and self.threads is not None:
            return self.threads.run(lambda: self._step(cache, inputs, positions, judged))
        return self._step(cache, inputs, positions, judged)

    def release_threads(self) -> None:
        """Give the caller its thread count back: the steps leave the count they chose set between them
        (decode/step_threads.py)."""
        if self.threads is not None:
            self.threads.release()

    def _step(self, cache: KVCache, inputs: torch.Tensor, positions: int, judged: _Judged | None) -> torch.Tensor:
        if judged is not None:
            return self._judged_step(cache, inputs, positions, judged)
        if cache.length > 0 and self.traced is not None:  # explicit `traced`, or the server's: traced for good
            return self.traced.step(cache, inputs)[:, -positions:]
        if cache.length > 0 and self.captured is not None:
            return self.captured.step(cache, inputs)[:, -positions:]
        return self._eager(cache, inputs, positions)

    def _eager(self, cache: KVCache, inputs: torch.Tensor, positions: int) -> torch.Tensor:
        if positions == 1:
            return self.model(inputs, cache=cache, last_only=True)[0]
        hidden = self.model.hidden_states(inputs, cache)
        # The output head on the last positions only: the first pass also feeds the whole prompt.
        return self.model.lm_head(hidden[:, -positions:])[..., :self.model.config.vocab_size]

    def _judge(self, cache: KVCache, inputs: torch.Tensor, tokens_left: int | None) -> _Judged | None:
        """Auto's way for a step after the prompt: traced when the trace is kept and faster, or will be repaid by
        the tokens left; eager otherwise.  None where nothing is judged: the prompt, a mode without traces, an
        explicit `traced`, and the server's steps (`tokens_left` None), whose traces serve its whole life."""
        if cache.length == 0 or self.traced is None or not self.trace_when_repaid or tokens_left is None:
            return None
        payback = trace_payback.PAYBACK
        key = self.traced.key_for(cache, inputs)
        kept = key in self.traced.traces
        shape = (*key, self.traced.threads)  # a step's timings depend on the threads its trace is made for
        # the eager steps the process ran at this shape before these steps (a call's) were made
        earlier = self._eager_before.setdefault(shape, payback.timings(self.model, shape).eager_seen)
        return _Judged(payback.traces(self.model, shape, tokens_left, kept, earlier), kept, shape)

    def _judged_step(self, cache: KVCache, inputs: torch.Tensor, positions: int, judged: _Judged) -> torch.Tensor:
        """The step as `_judge` said, timed for the next judgements."""
        payback, traced, kept, shape = trace_payback.PAYBACK, judged.traced, judged.kept, judged.shape
        # whether the host stays quiet through a trace (seconds long): only a quiet trace's cost is kept for others
        mark = payback.load.mark() if traced and not kept else None
        start = payback.clock()
        logits = self.traced.step(cache, inputs)[:, -positions:] if traced else self._eager(cache, inputs, positions)
        seconds = payback.clock() - start
        if traced and not kept:
            payback.note_trace(self.model, shape, seconds, payback.load.quiet_since(mark))
        else:
            (payback.note_traced if traced else payback.note_eager)(self.model, shape, seconds)
        return logits

    def prepare(self, cache: KVCache, width: int) -> None:
        """Make the step for one row of `width` tokens now (a trace, or a capture), so that a model that cannot
        be traced or captured fails here rather than at its first request.  It runs on `cache`'s row, whose
        tokens are then garbage: the caller clears it."""
        tokens = torch.zeros(cache.lengths.numel(), width, dtype=torch.long, device=self.device)
        if self.traced is not None:
            self.traced.step(cache, tokens)
        elif self.captured is not None:
            for _ in range(2):  # the first run warms up, the second captures
                self.captured.step(cache, tokens)
