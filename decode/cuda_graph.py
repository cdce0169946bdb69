"""Decode steps replayed as CUDA graphs, for batch sizes where launching kernels costs more than running
them (a GPT-2 step at batch 1 is ~150 small kernels).  `make bench` on a CUDA machine times the graphs against
eager steps (`python -m bench.experiments generate_speed`: bench/results/gpu/generate_speed.json, `ours fp32`
against `ours fp32 eager`).

A StaticKVCache keeps every tensor shape fixed from step to step and advances its rows' lengths on the device,
so one step can be captured once and replayed for every later one: the first step of a shape runs eagerly on a
side stream (which also warms up cuBLAS and the caching allocator, as capture requires), the second is captured,
and each step after copies its tokens into the captured input and replays.  A graph reads and writes the memory
it was captured on, so it is kept per cache storage, row count and token count: generate() makes one cache per
call, the server one for its life, whose first rows each of its padded row counts uses.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from model.gpt import GPT
from model.kv_cache import StaticKVCache


@dataclass
class _Captured:
    tokens: torch.Tensor  # the graph's input, copied into before each replay
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None  # its output, overwritten at every replay


class CapturedSteps:
    """`model(tokens, cache=cache)[0]` for (B, W) tokens over a StaticKVCache, as CUDA graphs."""

    def __init__(self, model: GPT):
        self.model = model
        self.captured: dict[tuple, _Captured] = {}

    def step(self, cache: StaticKVCache, tokens: torch.Tensor) -> torch.Tensor:
        cache.check_room(tokens.size(1))  # a replay runs no Python that would check it
        key = (*tokens.shape, cache.lengths.data_ptr(), *(t.data_ptr() for t in cache.k + cache.v))
        entry = self.captured.get(key)
        if entry is None:
            entry = self.captured[key] = _Captured(tokens.clone())
            side = torch.cuda.Stream(device=tokens.device)
            side.wait_stream(torch.cuda.current_stream(tokens.device))
            with torch.cuda.stream(side):
                logits = self.model(entry.tokens, cache=cache)[0]
            torch.cuda.current_stream(tokens.device).wait_stream(side)
            return logits
        entry.tokens.copy_(tokens)
        if entry.graph is None:
            # Capture runs the step's Python once (its host-side advance of `cache.length` included) and records its
            # kernels without running them; the replay below runs them.
            entry.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(entry.graph):
                entry.logits = self.model(entry.tokens, cache=cache)[0]
        else:
            cache.length += tokens.size(1)  # the host's count; the replay advances the rows' lengths
        entry.graph.replay()
        return entry.logits
