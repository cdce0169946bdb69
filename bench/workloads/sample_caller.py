"""A process that makes sample.py's call on each request, for bench/experiments/user_start.py: sample.py's own
config (its defaults, with `--checkpoint ARTIFACT`), its `main`'s loading steps (`pick_checkpoint`, `choose_device`,
`load_model`, `pack_for_inference`), then per request sample.py's `sample_one` (what `python sample.py --prompt
TEXT --num-samples ROWS --max-new-tokens N` runs after loading) on the text of the request's first prompt.

    python -m bench.workloads.sample_caller ARTIFACT

Why this and not `python sample.py` itself: one sample.py run makes one call, so timing it again and again means
a process per call, whose import, load and first-call set-up would be every figure (bench/experiments/
first_request.py and `make demo` time a start); and its `--prompts-file` reads the whole file before it starts
(as bytes, to number the lines), so a FIFO fed a line at a time gives it nothing until it is closed.  This keeps
sample.py's code path from its config to its printed samples, in one process started fresh, whose first request
is the user's first call: the `generate()` call with sample.py's settings (temperature 0.8, top-k 200, its seed,
stopping at end-of-text), the tokenizer's encoding of the prompt and decoding of the samples, and the printing.
The samples are printed into memory, not onto a terminal.  The prompt is sent as text, as a user types it, so its
length in tokens is the tokenizer's (for English text cut at token boundaries, as the benchmark's prompts are,
the same length); the rows are `--num-samples` copies of it, each sampled with its own seed.

Requests come as JSON lines on stdin ({"prompt": [[token, ...], ...], "new_tokens": N}); each answer is one JSON
line on stdout: the call's seconds and its new tokens (all rows, as sample.py's own timing line counts them: a row
that drew end-of-text stops there).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import sys
import time

import torch

# sample.py's timing line on stderr: "--- 384 new tokens (batch 12): the first after ..."
NEW_TOKENS = re.compile(r"^--- ([\d,]+) new tokens \(batch \d+\)", re.MULTILINE)


def build(artifact: str):
    import sample
    from data.tokenizer import decode
    from model.packed_linear import pack_for_inference
    from runtime.cli import parse_config
    from runtime.device import choose_device
    from storage.artifact import load_model
    from storage.run_folder import pick_checkpoint
    cfg = parse_config(sample.SampleConfig, sample.__doc__, ["--checkpoint", artifact])
    folder, _ = pick_checkpoint(cfg.checkpoint)
    device = choose_device(cfg.device)
    model, _ = load_model(folder, device)
    pack_for_inference(model)

    def call(prompt: torch.Tensor, new_tokens: int) -> dict:
        printed, timing = io.StringIO(), io.StringIO()
        start = time.perf_counter()
        asked = dataclasses.replace(cfg, prompt=decode(prompt[0].tolist()), num_samples=prompt.size(0),
                                    max_new_tokens=new_tokens)
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(timing):
            sample.sample_one(asked, model, device)
        seconds = time.perf_counter() - start
        made = NEW_TOKENS.search(timing.getvalue())
        if made is None:
            raise RuntimeError(f"sample.py's timing line is not where it was: {timing.getvalue()!r}")
        return {"seconds": seconds, "new_tokens": int(made.group(1).replace(",", ""))}
    return call


if __name__ == "__main__":
    answers = sys.stdout
    sys.stdout = sys.stderr  # what the libraries print stays off the answers
    call = build(sys.argv[1])
    print(json.dumps({"ready": True}), file=answers, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(call(torch.tensor(request["prompt"], dtype=torch.long), request["new_tokens"])),
              file=answers, flush=True)
