"""The evaluation loss (model/head_loss.py's `padded_cross_entropy`: train.py's validation, the scorecard's loss,
prune's and quantize's) through F.cross_entropy a chunk at a time, against the logsumexp it computed before:

    python -m bench.standalone.eval_loss     # GPT-2 124M (random weights), 8 windows of 256 tokens

In turns, --rounds times, on the logits of one evaluation batch: the loss both ways (the order alternating), and
the forward pass that made the logits, for the loss's share of an evaluation step.  Each figure is the median (and
range) over rounds, and each round's ratio of the two ways.  Results: bench/results/eval_loss.json.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiments.generate_speed import real_prompts
from bench.record import RESULTS_DIR, write_result
from model.config import PRESETS, preset
from model.gpt import GPT
from model.head_loss import ROWS_PER_CHUNK, padded_cross_entropy
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.errors import UserError
from runtime.timing import Environment, Spread, environment


@dataclass
class EvalLossConfig:
    model: str = option("gpt2", "model preset (random weights)", choices=tuple(PRESETS))
    batch_size: int = option(8, "windows per evaluation batch", min=1)
    block_size: int = option(256, "tokens per window", min=2)
    rounds: int = option(7, "turns through every measurement", min=1)
    results_dir: Path = option(RESULTS_DIR, "where eval_loss.json goes")

    def __post_init__(self):
        check_options(self, UserError)
        if self.block_size > preset(self.model).block_size:
            raise UserError(f"--block-size {self.block_size} is longer than the {self.model} context of "
                            f"{preset(self.model).block_size}; ask for fewer")


@dataclass
class EvalLoss:
    model: str
    batch_size: int
    block_size: int
    rounds: int
    ms: dict[str, Spread]  # "forward" | "cross_entropy" | "logsumexp" -> ms over rounds
    logsumexp_over_cross_entropy: Spread  # per round
    loss_share: dict[str, Spread]  # way -> the loss's share of forward + loss, per round
    environment: Environment


def logsumexp_loss(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The way before: the mean cross-entropy from logsumexp and a gather, a chunk of rows at a time."""
    logits, targets = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
    loss_sum = torch.zeros(())
    for start in range(0, logits.size(0), ROWS_PER_CHUNK):
        chunk, target = logits[start:start + ROWS_PER_CHUNK], targets[start:start + ROWS_PER_CHUNK]
        chunk[:, vocab_size:] = float("-inf")
        counted = target != -1
        lse = torch.logsumexp(chunk, dim=1)
        loss_sum += ((lse - chunk.gather(1, target.clamp(min=0)[:, None]).squeeze(1)) * counted).sum()
    return loss_sum / (targets != -1).sum()


def timed_ms(call) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = call()
    return 1000 * (time.perf_counter() - start), out


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(EvalLossConfig, __doc__, argv)
    torch.manual_seed(0)
    model = GPT(preset(cfg.model)).eval()
    vocab = model.config.vocab_size
    windows = real_prompts(cfg.batch_size, cfg.block_size + 1)
    x, y = windows[:, :-1], windows[:, 1:]
    ways = {"cross_entropy": padded_cross_entropy, "logsumexp": logsumexp_loss}
    ms = {name: [] for name in ("forward", *ways)}
    with torch.inference_mode():
        for round_ in range(cfg.rounds + 1):  # the first round untimed: first runs, allocations
            forward_ms, padded = timed_ms(lambda: model.lm_head(model.hidden_states(x, None, False, None)))
            ms["forward"].append(forward_ms)
            losses = {}
            for name in list(ways) if round_ % 2 else list(reversed(ways)):
                logits = padded.clone()
                ms[name].append(timed_ms(lambda: ways[name](logits, y, vocab))[0])
                losses[name] = float(ways[name](padded.clone(), y, vocab))
            if abs(losses["cross_entropy"] - losses["logsumexp"]) > 1e-4 * abs(losses["logsumexp"]):
                raise UserError(f"the two ways disagree: {losses}")  # a bug, named before any figure is kept
    share = lambda name: Spread.of([loss / (loss + fwd) for loss, fwd in zip(ms[name][1:], ms["forward"][1:])])
    result = EvalLoss(cfg.model, cfg.batch_size, cfg.block_size, cfg.rounds,
                      {name: Spread.of(values[1:]) for name, values in ms.items()},
                      Spread.of([old / new for old, new in zip(ms["logsumexp"][1:], ms["cross_entropy"][1:])]),
                      {name: share(name) for name in ways}, environment(torch.device("cpu")))
    ratio = result.logsumexp_over_cross_entropy
    print(f"{cfg.model}, {cfg.batch_size} x {cfg.block_size} tokens: forward {result.ms['forward'].median:.1f} ms; "
          f"loss {result.ms['cross_entropy'].median:.1f} ms through F.cross_entropy, "
          f"{result.ms['logsumexp'].median:.1f} ms through logsumexp ({ratio.median:.2f}x, rounds "
          f"{ratio.min:.2f}-{ratio.max:.2f}); the loss's share of a step {result.loss_share['cross_entropy'].median:.0%}"
          f" against {result.loss_share['logsumexp'].median:.0%}")
    write_result(cfg.results_dir, "eval_loss", result)


if __name__ == "__main__":
    main()
