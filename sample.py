"""Generate text from a checkpoint folder (float, pruned or int8) or a Hugging Face GPT-2 folder.

    python sample.py --prompt "The history of"                  # the most-trained checkpoint under out/
    echo "Once upon a time" | python sample.py --checkpoint out/train --num-samples 3 --top-p 0.9
    python sample.py --prompts-file prompts.jsonl --output out.jsonl --batch-size 8

A prompts file holds one JSON object per line: {"prompt": "...", and optionally "max_new_tokens",
"temperature", "top_k", "top_p", "seed"}; missing settings come from the flags.  Prompts with the same
length and settings are generated together, `--batch-size` at a time, with the KV cache; each output
line has the prompt's line number, text, tokens, finish reason and latency.  A malformed line is
reported with its number and the others still run.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from data.tokenizer import decode, encode
from model.artifact import load_model
from model.config import EOT_TOKEN
from model.generate import DECODE_MODES, generate
from model.hub import resolve_checkpoint
from model.sampling import SamplingParams
from runtime.cli import parse_config
from runtime.device import choose_device
from runtime.errors import UserError
from training.checkpoint import default_checkpoint

PROMPT_SETTINGS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed")


class SampleError(UserError, ValueError):
    pass


@dataclass
class SampleConfig:
    checkpoint: str | None = field(default=None, metadata={"help": "artifact folder or hub name (default: the "
                                                                    "train.py checkpoint under out/ trained on the "
                                                                    "most tokens)"})
    prompt: str | None = field(default=None, metadata={"help": "prompt text (default: standard input when it is "
                                                                "not a terminal)"})
    prompt_file: str | None = field(default=None, metadata={"help": "read one prompt from this file"})
    prompts_file: str | None = field(default=None, metadata={"help": "JSONL of prompts (and optional settings) to "
                                                                      "generate in batches; see above"})
    output: str | None = field(default=None, metadata={"help": "with --prompts-file: write the results as JSONL "
                                                                "here (default: standard output)"})
    batch_size: int = field(default=8, metadata={"help": "with --prompts-file: prompts decoded together"})
    num_samples: int = field(default=1, metadata={"help": "samples of the prompt"})
    max_new_tokens: int = field(default=100, metadata={"help": "tokens to generate per sample"})
    temperature: float = field(default=0.8, metadata={"help": "0 (or below 1e-4) for greedy decoding"})
    top_k: int | None = field(default=200, metadata={"help": "sample among the k most likely tokens"})
    top_p: float | None = field(default=None, metadata={"help": "nucleus sampling: the smallest set of tokens "
                                                                 "holding this probability"})
    seed: int = field(default=1337, metadata={"help": "random seed (sample i uses seed + i)"})
    device: str = field(default="auto", metadata={"help": "auto, cpu, cuda, ..."})
    decode: str = field(default="dynamic", metadata={
        "help": "how cached decode steps run: dynamic (the keys grow; fastest on the CPU), static (fixed shapes), "
                "cuda-graph (static, each step replayed as one captured CUDA graph: fewer kernel launches at small "
                "batch on a GPU); the tokens are the same", "choices": DECODE_MODES})

    def __post_init__(self):
        if sum(x is not None for x in (self.prompt, self.prompt_file, self.prompts_file)) > 1:
            raise SampleError("give one of --prompt, --prompt-file and --prompts-file")
        for name in ("num_samples", "max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise SampleError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("prompt_file", "prompts_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise SampleError(f"--{name.replace('_', '-')} {path} is not a file")
        try:
            self.sampling()
        except UserError as e:
            raise SampleError(f"--{str(e).replace('_', '-')}") from e

    def sampling(self, **overrides) -> SamplingParams:
        return SamplingParams(**{**{k: getattr(self, k) for k in PROMPT_SETTINGS}, **overrides})


def read_prompt(cfg: SampleConfig) -> str:
    if cfg.prompt is not None:
        return cfg.prompt
    if cfg.prompt_file is not None:
        return Path(cfg.prompt_file).read_text()
    if not sys.stdin.isatty():
        return sys.stdin.read()
    return "\n"


def completion(prompt_ids: list[int], row: list[int], params: SamplingParams) -> tuple[list[int], str]:
    """The generated tokens (up to end-of-text) and why generation stopped."""
    generated = row[len(prompt_ids):]
    if params.stop_at_eot and EOT_TOKEN in generated:
        return generated[:generated.index(EOT_TOKEN)], "stop"
    return generated, "length"


def sample_one(cfg: SampleConfig, model, device) -> None:
    prompt_ids = encode(read_prompt(cfg)) or [EOT_TOKEN]
    params = cfg.sampling()
    start = time.perf_counter()
    out = generate(model, torch.tensor([prompt_ids] * cfg.num_samples, device=device), params, decode=cfg.decode)
    elapsed = time.perf_counter() - start
    new_tokens = 0
    for i, row in enumerate(out.tolist()):
        generated, _ = completion(prompt_ids, row, params)
        new_tokens += len(generated)
        print(f"--- sample {i + 1} ---")
        print(decode(prompt_ids) + decode(generated))
    print(f"--- {new_tokens} new tokens in {elapsed:.2f}s: {new_tokens / elapsed:.1f} tokens/s "
          f"(batch {cfg.num_samples})", file=sys.stderr)


def read_prompts(cfg: SampleConfig) -> tuple[list[tuple[int, list[int], SamplingParams]], list[dict]]:
    """(line number, prompt tokens, settings) of every good line, and an error record for every bad one."""
    jobs, errors = [], []
    for number, line in enumerate(Path(cfg.prompts_file).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict) or not isinstance(entry.get("prompt"), str):
                raise SampleError('expected an object with a "prompt" string')
            unknown = set(entry) - {"prompt", *PROMPT_SETTINGS}
            if unknown:
                raise SampleError(f"unknown keys {sorted(unknown)}; known: prompt, {', '.join(PROMPT_SETTINGS)}")
            params = cfg.sampling(**{k: entry[k] for k in PROMPT_SETTINGS if k in entry})
            jobs.append((number, encode(entry["prompt"]) or [EOT_TOKEN], params))
        except (json.JSONDecodeError, UserError, TypeError) as e:
            errors.append({"line": number, "error": str(e)})
            print(f"{cfg.prompts_file}:{number}: skipped: {e}", file=sys.stderr)
    return jobs, errors


def sample_many(cfg: SampleConfig, model, device) -> None:
    jobs, errors = read_prompts(cfg)
    groups: dict[tuple, list] = {}  # same length and settings: one batch shape, one call to generate
    for job in jobs:
        number, ids, params = job
        groups.setdefault((len(ids), tuple(getattr(params, k) for k in PROMPT_SETTINGS)), []).append(job)
    results = list(errors)
    with tqdm(total=len(jobs), desc="prompts", unit="prompt", file=sys.stderr) as bar:
        for group in groups.values():
            for first in range(0, len(group), cfg.batch_size):
                batch = group[first:first + cfg.batch_size]
                params = batch[0][2]
                start = time.perf_counter()
                try:
                    out = generate(model, torch.tensor([ids for _, ids, _ in batch], device=device), params,
                                   decode=cfg.decode)
                except UserError as e:  # e.g. a prompt too long for the context: these lines alone fail
                    results += [{"line": number, "error": str(e)} for number, _, _ in batch]
                    bar.update(len(batch))
                    continue
                latency = time.perf_counter() - start
                for (number, ids, _), row in zip(batch, out.tolist()):
                    tokens, reason = completion(ids, row, params)
                    results.append({"line": number, "text": decode(tokens), "tokens": tokens,
                                    "finish_reason": reason, "latency_s": round(latency, 4)})
                bar.update(len(batch))
    lines = [json.dumps(r) for r in sorted(results, key=lambda r: r["line"])]
    if cfg.output:
        Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.output).write_text("".join(line + "\n" for line in lines))
        print(f"wrote {len(lines)} results ({len(errors)} malformed lines) to {cfg.output}", file=sys.stderr)
    else:
        print("\n".join(lines))


def main(argv=None) -> None:
    try:
        cfg = parse_config(SampleConfig, __doc__, argv)
        folder, why = (resolve_checkpoint(cfg.checkpoint), "--checkpoint") if cfg.checkpoint else default_checkpoint()
        print(f"model: {folder} ({why})", file=sys.stderr)
        device = choose_device(cfg.device)
        if cfg.decode == "cuda-graph" and device.type != "cuda":
            raise SampleError(f"--decode cuda-graph needs a CUDA device, and this run is on {device}; use "
                              f"--decode dynamic")
        model, meta = load_model(folder, device)
        print(f"loaded {meta['artifact']} model from {folder}", file=sys.stderr)
        (sample_many if cfg.prompts_file else sample_one)(cfg, model, device)
    except UserError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
