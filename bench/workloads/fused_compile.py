"""The fused decode step's compile in a fresh process, for bench/experiments/fused_step.py: whether a second process
pays the compile again once the first has filled Inductor's cache.  It builds the preset with random weights
(seeded), packs its linear layers as sample.py does, takes the kernel of each product shape from the first process
(so that it compiles the same graph), and times the first fused step of each row count; prints JSON: the seconds
per row count, and Inductor's FX graph cache hits, misses and bypasses.

    python -m bench.workloads.fused_compile PRESET PROMPT_TOKENS MAX_LEN KERNELS_JSON BATCH [BATCH ...]

MAX_LEN: the KV cache's positions, the first process's: the compiled graph is made for the cache views' strides.

$TORCHINDUCTOR_CACHE_DIR names the cache (the first process's).
"""
from __future__ import annotations

import json
import sys

import torch
from torch._dynamo.utils import counters

from bench.fused_decode_step import FusedSteps
from model.config import preset
from model.gpt import GPT
from model.kv_cache import KVCache
from model.packed_linear import CHOICES, pack_for_inference


def compile_seconds(name: str, prompt_tokens: int, max_len: int, kernels: list, batches: list[int]) -> dict:
    torch.manual_seed(0)
    model = GPT(preset(name)).eval()
    pack_for_inference(model)
    CHOICES.chosen.update({tuple(shape): kernel for shape, kernel in kernels})
    fused, seconds = FusedSteps(model), {}
    for batch in batches:
        cache = KVCache.allocate(model.config, batch, max_len, "cpu")
        tokens = torch.zeros(batch, prompt_tokens, dtype=torch.long)
        with torch.inference_mode():  # as the first process (and generate()) runs its steps
            model(tokens, cache=cache, last_only=True)
            before = fused.setup_s
            fused.step(cache, tokens[:, :1])
        seconds[batch] = fused.setup_s - before
    return {"compile_s": seconds, "cache_hits": counters["inductor"]["fxgraph_cache_hit"],
            "cache_misses": counters["inductor"]["fxgraph_cache_miss"],
            "cache_bypasses": counters["inductor"]["fxgraph_cache_bypass"]}


if __name__ == "__main__":
    with open(sys.argv[4]) as kept:
        chosen = json.load(kept)
    print(json.dumps(compile_seconds(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), chosen,
                                     [int(b) for b in sys.argv[5:]])))
