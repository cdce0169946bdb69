"""One generate() call as sample.py makes it, in a fresh process, for bench/experiments/one_off_decode.py: the preset
with random weights (seeded), its linear layers packed, one greedy call on a seeded random prompt that end-of-text
does not stop; prints the whole call's time, its first new token's, the tokens and torch's thread count as JSON.

    python -m bench.workloads.generate_once PRESET DECODE NEW_TOKENS PROMPT_TOKENS THREADS   # THREADS 0: torch's own
"""
from __future__ import annotations

import json
import sys
import time

import torch

from model.config import preset
from decode.generate import generate
from model.gpt import GPT
from model.packed_linear import pack_for_inference
from decode.sampling import SamplingParams


def one_call(name: str, decode: str, new_tokens: int, prompt_tokens: int, threads: int) -> dict:
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT(preset(name)).eval()
    pack_for_inference(model)
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_tokens), generator=torch.Generator().manual_seed(1))
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0, stop_at_eot=False)
    first = []
    start = time.perf_counter()
    out = generate(model, prompt, params, decode=decode,
                   on_token=lambda _: first or first.append(time.perf_counter() - start))
    call_s = time.perf_counter() - start
    return {"call_s": call_s, "first_token_s": first[0], "tokens": out[0].tolist(), "threads": torch.get_num_threads()}


if __name__ == "__main__":
    print(json.dumps(one_call(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]))))
