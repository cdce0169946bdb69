"""The evaluation loss (model/head_loss.py's `padded_cross_entropy`: train.py's validation, the scorecard's loss,
prune's and quantize's) through F.cross_entropy a chunk at a time, against the logsumexp it computed before:

    python -m bench.standalone.eval_loss     # GPT-2 124M (random weights), 8 windows of 256 tokens

In turns (runtime/timing.py's `time_interleaved`, the order reversed every other round), --rounds times: the
forward pass of one evaluation batch, for the loss's share of an evaluation step, and the loss of its logits both
ways.  Each figure is the median (and range) over rounds, and each round's ratio of the two ways.  Results:
bench/results/eval_loss.json.
"""
from __future__ import annotations

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
from runtime.timing import Environment, Spread, environment, time_interleaved


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


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(EvalLossConfig, __doc__, argv)
    torch.manual_seed(0)
    model = GPT(preset(cfg.model)).eval()
    vocab = model.config.vocab_size
    windows = real_prompts(cfg.batch_size, cfg.block_size + 1)
    x, y = windows[:, :-1], windows[:, 1:]
    ways = {"cross_entropy": padded_cross_entropy, "logsumexp": logsumexp_loss}
    with torch.inference_mode():
        def forward() -> None:
            logits[0] = model.lm_head(model.hidden_states(x, None, False, None))

        logits = [None]  # the latest forward pass's
        forward()
        # Both ways only set the padding columns to -inf, which leaves the logits as they were for the other.
        losses = {name: float(way(logits[0], y, vocab)) for name, way in ways.items()}
        if abs(losses["cross_entropy"] - losses["logsumexp"]) > 1e-4 * abs(losses["logsumexp"]):
            raise UserError(f"the two ways disagree: {losses}")  # a bug, named before any figure is kept
        calls = {"forward": forward,
                 **{name: (lambda way=way: way(logits[0], y, vocab)) for name, way in ways.items()}}
        seconds = time_interleaved(calls, cfg.rounds, alternate=True)  # the first round untimed: first runs
    ms = {name: [1000 * s for s in values] for name, values in seconds.items()}
    share = lambda name: Spread.of([loss / (loss + fwd) for loss, fwd in zip(ms[name], ms["forward"])])
    result = EvalLoss(cfg.model, cfg.batch_size, cfg.block_size, cfg.rounds,
                      {name: Spread.of(values) for name, values in ms.items()},
                      Spread.of([old / new for old, new in zip(ms["logsumexp"], ms["cross_entropy"])]),
                      {name: share(name) for name in ways}, environment(torch.device("cpu")))
    ratio = result.logsumexp_over_cross_entropy
    print(f"{cfg.model}, {cfg.batch_size} x {cfg.block_size} tokens: forward {result.ms['forward'].median:.1f} ms; "
          f"loss {result.ms['cross_entropy'].median:.1f} ms through F.cross_entropy, "
          f"{result.ms['logsumexp'].median:.1f} ms through logsumexp ({ratio.median:.2f}x, rounds "
          f"{ratio.min:.2f}-{ratio.max:.2f}); the loss's share of a step "
          f"{result.loss_share['cross_entropy'].median:.0%} against {result.loss_share['logsumexp'].median:.0%}")
    write_result(cfg.results_dir, "eval_loss", result)


if __name__ == "__main__":
    main()
