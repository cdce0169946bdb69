"""Generate text from a checkpoint folder (float, pruned or int8) or a Hugging Face GPT-2 folder.

    python sample.py --prompt "The history of"                  # newest checkpoint under out/
    echo "Once upon a time" | python sample.py --checkpoint out/train --num-samples 3 --top-p 0.9
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from data.tokenizer import TokenizerError, decode, encode
from model.artifact import ArtifactError, find_latest_artifact, load_model
from model.generate import generate
from model.sampling import SamplingParams
from runtime.device import choose_device


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, help="artifact folder (default: the newest under out/)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="prompt text (default: read standard input when it is not a terminal)")
    source.add_argument("--prompt-file", type=Path, help="read the prompt from this file")
    parser.add_argument("--num-samples", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 for greedy decoding")
    parser.add_argument("--top-k", type=int, default=200)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--device", default="auto")
    return parser.parse_args(argv)


def read_prompt(args) -> str:
    if args.prompt is not None:
        return args.prompt
    if args.prompt_file is not None:
        return args.prompt_file.read_text()
    if not sys.stdin.isatty():
        return sys.stdin.read()
    return "\n"


def check(args) -> None:
    if args.num_samples < 1:
        raise ValueError(f"--num-samples must be at least 1, got {args.num_samples}")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be at least 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p}")


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        check(args)
        folder = args.checkpoint or find_latest_artifact()
        device = choose_device(args.device)
        model, meta = load_model(folder, device)
        print(f"loaded {meta['artifact']} model from {folder}", file=sys.stderr)
        prompt_ids = encode(read_prompt(args)) or [50256]
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                top_k=args.top_k, top_p=args.top_p, seed=args.seed)
        idx = torch.tensor([prompt_ids] * args.num_samples, device=device)
        start = time.perf_counter()
        out = generate(model, idx, params)
        elapsed = time.perf_counter() - start
    except (ArtifactError, TokenizerError, ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    new_tokens = 0
    for i, row in enumerate(out.tolist()):
        generated = row[len(prompt_ids):]
        if 50256 in generated:
            generated = generated[:generated.index(50256)]
        new_tokens += len(generated)
        print(f"--- sample {i + 1} ---")
        print(decode(row[:len(prompt_ids)]) + decode(generated))
    print(f"--- {new_tokens} new tokens in {elapsed:.2f}s: {new_tokens / elapsed:.1f} tokens/s "
          f"(batch {args.num_samples})", file=sys.stderr)


if __name__ == "__main__":
    main()
