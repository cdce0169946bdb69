"""A process that decodes as a user's does, for bench/experiments/user_start.py: `load_model` on an artifact (a float
one, or an int8 one as quantize/dynamic.py writes it, the tied head in int8 too), `pack_for_inference`, then one
`generate()` call per request, greedy, on the prompt it is sent.  Nothing is warmed up or settled beforehand: the
first request is the user's first call.

    python -m bench.workloads.user_decoder ARTIFACT PATH   # PATH default|fixed

`default` is generate()'s own decode (`auto`: its trace, its kernels and its thread count chosen at run time);
`fixed` is the best fixed path: every step traced, on all the process's threads whatever the host is doing.
Requests come as JSON lines on stdin ({"prompt": [[token, ...], ...], "new_tokens": N}); each answer is one JSON
line on stdout: the call's seconds, its new tokens (all rows), its first token's seconds, and the thread count its
steps ran with (the median over its steps after the prompt).
"""
from __future__ import annotations

import json
import sys
import time

import torch


def build(artifact: str, path: str):
    from decode.generate import generate
    from decode.sampling import SamplingParams
    from model.packed_linear import pack_for_inference
    from storage.artifact import load_model
    if path == "fixed":
        # All threads at every step: the count decode/step_threads.py would otherwise read from the host.
        from decode import step_threads
        step_threads.StepThreads.count = lambda self: self.most
    model, _ = load_model(artifact, "cpu")
    pack_for_inference(model)
    decode = "auto" if path == "default" else "traced"

    def call(prompt: torch.Tensor, new_tokens: int) -> dict:
        times, threads = [], []

        def on_token(_):
            times.append(time.perf_counter() - start)
            threads.append(torch.get_num_threads())  # the count the last step left set (generate() resets it after)
        start = time.perf_counter()
        generate(model, prompt, SamplingParams(max_new_tokens=new_tokens, temperature=0, stop_at_eot=False),
                 decode=decode, on_token=on_token)
        return {"seconds": time.perf_counter() - start, "new_tokens": new_tokens * prompt.size(0),
                "first_token_s": times[0],
                "threads": sorted(threads[1:] or threads)[len(threads[1:] or threads) // 2]}
    return call


if __name__ == "__main__":
    answers = sys.stdout
    sys.stdout = sys.stderr  # what the libraries print stays off the answers
    call = build(*sys.argv[1:3])
    print(json.dumps({"ready": True}), file=answers, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        answer = call(torch.tensor(request["prompt"], dtype=torch.long), request["new_tokens"])
        print(json.dumps(answer), file=answers, flush=True)
