"""Generation speed against Hugging Face transformers on the same weights, in the same run.

    pip install transformers        # benchmark-only dependency
    python bench/generate_speed.py  # GPT-2 124M config, random weights, 32-token prompt, 64 new tokens, greedy

Both sides decode greedily with a KV cache from identical weights; repeats are interleaved so that
machine noise hits both alike.  The tokens generated are checked to be identical.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from bench.timing import environment, summary, time_repeats
from model.config import preset
from model.generate import generate
from model.gpt import GPT
from model.hf import export_hf_gpt2
from model.sampling import SamplingParams
from runtime.device import choose_device


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 12])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=Path("bench/results/generate_speed.json"))
    args = parser.parse_args(argv)
    try:
        import transformers
    except ImportError:
        sys.exit("this benchmark compares against Hugging Face transformers: pip install transformers")

    device = choose_device(args.device)
    torch.manual_seed(0)
    ours = GPT(preset(args.model)).to(device).eval()
    with tempfile.TemporaryDirectory() as tmp:
        export_hf_gpt2(ours, tmp)
        theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp).to(device).eval()

    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0, stop_at_eot=False)
    results = []
    for batch in args.batch_sizes:
        prompt = torch.randint(0, 50257, (batch, args.prompt_tokens), device=device)
        ours_out = generate(ours, prompt, params)
        with torch.inference_mode():
            hf_out = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                     max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                     pad_token_id=50256, use_cache=True)
        same_tokens = bool(torch.equal(ours_out, hf_out))

        def run_ours():
            generate(ours, prompt, params)

        def run_theirs():
            with torch.inference_mode():
                theirs.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                pad_token_id=50256, use_cache=True)

        ours_t, theirs_t = [], []
        for _ in range(args.repeats):  # interleaved, one call each per round
            ours_t += time_repeats(run_ours, 1, warmup=0 if ours_t else 1, device=device)
            theirs_t += time_repeats(run_theirs, 1, warmup=0 if theirs_t else 1, device=device)
        new = batch * args.new_tokens
        ours_tps, theirs_tps = summary([new / t for t in ours_t]), summary([new / t for t in theirs_t])
        row = {"batch": batch, "ours_tokens_per_s": ours_tps, "hf_tokens_per_s": theirs_tps,
               "speedup": ours_tps["median"] / theirs_tps["median"], "identical_tokens": same_tokens}
        results.append(row)
        print(f"batch {batch:>2}: ours {ours_tps['median']:7.1f} new tokens/s, transformers "
              f"{theirs_tps['median']:7.1f}, speedup {row['speedup']:.2f}x, identical tokens: {same_tokens}")
    report = {"model": args.model, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "transformers": transformers.__version__, "results": results, "environment": environment(device)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
