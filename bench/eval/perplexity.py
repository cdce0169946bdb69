"""Perplexity of any model over a whole split, with both protocols of transformers' perplexity guide.

    python bench/eval/perplexity.py --checkpoint out/demo/train      # its training dataset's validation split
    python bench/eval/perplexity.py --checkpoint /path/to/gpt2 --dataset ../shared/data/wikitext-103-raw --split test

Non-overlapping windows restart the context every `context` tokens; the sliding window advances by
`--stride` (default half the context: 512 for GPT-2) and scores each token once with up to a full context
before it, which lowers the perplexity.  A stride not below the context would repeat the non-overlapping
protocol, so the sliding one is then skipped, with a line saying so.  Every token of the split after the first is scored exactly once in both.  The split is
the raw text, documents joined with end-of-text, as train.py sees it (see README: the GPT-2 paper's
figures were taken on detokenized text).
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from data.corpus import dataset_help
from data.loader import sliding_windows
from data.token_files import load_split
from data.tokenizer import get_tokenizer
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.device import choose_device
from runtime.errors import UserError
from runtime.progress import ProgressBar
from storage.artifact import load_model
from storage.run_folder import evaluation_context, evaluation_dataset, pick_checkpoint

DEFAULT_DATASET = "builtin"  # for a checkpoint that records no training dataset


class PerplexityError(UserError):
    pass


@dataclass
class PerplexityConfig:
    checkpoint: str | None = option(None, "artifact folder (float, pruned, int8) or Hugging Face GPT-2 "
                                          "folder (default: the train.py checkpoint under out/ trained on the most tokens)")
    dataset: str | None = option(None, f"{dataset_help()} (default: the checkpoint's training dataset, else "
                                          f"{DEFAULT_DATASET})")
    split: str = option("validation", "which split", choices=("validation", "test"))
    context: int | None = option(None, "tokens of context per window (default: the block size the model was "
                                       "trained at, else its context)", min=2)
    stride: int | None = option(None, "sliding-window step; each window scores this "
                                      "many new tokens (default: half the context)", min=1)
    batch_size: int = option(8, "windows per forward pass", min=1)
    max_tokens: int | None = option(None, "score only the split's first N tokens "
                                          "(default: all)", min=2)
    device: str = option("auto", "auto, cpu, cuda, ...")
    out: str | None = option(None, "also write the result as JSON here")

    def __post_init__(self):
        check_options(self, PerplexityError)


@dataclass
class ProtocolResult:
    protocol: str
    context: int
    stride: int
    loss: float  # mean cross-entropy, nats per token
    perplexity: float
    scored_tokens: int
    bits_per_byte: float
    seconds: float


@torch.no_grad()
def score(model: torch.nn.Module, tokens, context: int, stride: int, batch_size: int,
          device: torch.device, desc: str) -> tuple[float, int]:
    """(summed negative log-likelihood in nats, scored tokens) over `tokens`."""
    total, count = 0.0, 0
    n_windows = math.ceil((len(tokens) - 1) / stride)
    with ProgressBar(total=n_windows, desc=desc, unit="window", leave=False) as bar:
        for x, y in sliding_windows(tokens, context, stride, batch_size):
            x, y = x.to(device), y.to(device)
            logits, _ = model(x)
            nll = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-1,
                                                    reduction="sum")
            total += float(nll)
            count += int((y != -1).sum())
            bar.update(len(x))
    return total, count


def measure(model, tokens, context: int, stride: int, batch_size: int, device, n_bytes: int) -> ProtocolResult:
    protocol = "non-overlapping" if stride == context else "sliding"
    t0 = time.perf_counter()
    nll, count = score(model, tokens, context, stride, batch_size, device, protocol)
    loss = nll / count
    return ProtocolResult(protocol, context, stride, loss, math.exp(loss), count, nll / math.log(2) / n_bytes,
                          time.perf_counter() - t0)


def run(cfg: PerplexityConfig) -> dict:
    device = choose_device(cfg.device)
    folder, why = pick_checkpoint(cfg.checkpoint)
    dataset, dataset_why = evaluation_dataset(cfg.dataset, folder, DEFAULT_DATASET)
    print(f"model: {folder} ({why}); dataset: {dataset} ({dataset_why})", file=sys.stderr)
    model, meta = load_model(folder, device)
    context, warning = evaluation_context(cfg.context, "--context", folder, model.config.block_size)
    if context > model.config.block_size:
        raise PerplexityError(f"--context {context} exceeds the model's {model.config.block_size} positions")
    if warning:
        print(warning, file=sys.stderr)
    tokens = load_split(dataset, cfg.split)
    if cfg.max_tokens:
        tokens = tokens[:cfg.max_tokens]
    n_bytes = len(get_tokenizer().decode_bytes(tokens[1:].tolist()))  # the scored text, in UTF-8 bytes
    protocols = [measure(model, tokens, context, context, cfg.batch_size, device, n_bytes)]
    stride = cfg.stride or context // 2
    skipped = {}
    if stride < context:
        protocols.append(measure(model, tokens, context, stride, cfg.batch_size, device, n_bytes))
    else:
        skipped["sliding"] = (f"--stride {stride} is not below the context of {context}, so its windows would be "
                              f"the non-overlapping ones; give a smaller --stride (or none: half the context)")
    return {"checkpoint": str(folder), "artifact": meta.kind, "dataset": dataset, "dataset_chosen": dataset_why,
            "split": cfg.split, "tokens": len(tokens), "bytes": n_bytes, "bytes_per_token": n_bytes / (len(tokens) - 1),
            "protocols": [asdict(p) for p in protocols], "skipped": skipped}


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(PerplexityConfig, __doc__, argv)
    result = run(cfg)
    print(f"{result['checkpoint']} on {result['dataset']} {result['split']}: {result['tokens']:,} tokens, "
          f"{result['bytes_per_token']:.2f} bytes per token")
    for p in result["protocols"]:
        print(f"  {p['protocol']:>15} (context {p['context']}, stride {p['stride']}): loss {p['loss']:.4f}, "
              f"perplexity {p['perplexity']:.2f}, {p['bits_per_byte']:.4f} bits/byte, {p['scored_tokens']:,} tokens "
              f"scored, {p['seconds']:.1f} s")
    for protocol, why in result["skipped"].items():
        print(f"  {protocol:>15} skipped: {why}")
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
