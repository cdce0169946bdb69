"""What a server's batch pays that generate() does not, for the prompts of one request (or of requests that arrive
together), and what serve/prefill.py and serve/runner.py's aligned steps give back:

    python -m bench.standalone.joining_batch     # GPT-2 124M (random weights), batches 4 and 12, 32-token prompts

In turns, --rounds times, on one process's model packed as the server packs it:
- prefill: the batch's prompts as one pass of all their rows (what the server now runs for prompts of one length,
  and generate() always), and as one one-row pass per prompt (what it ran before);
- step: --steps decode steps of the batch's rows, traced, over rows of the server's cache (16 rows of the model's
  context; the rows of one length), in the aligned form (generate()'s, and the server's for up to 4 rows of one
  length) and in the ragged form (each row at its own columns, through a mask: the server's for every other batch).
Each figure is the median (and range) over rounds of the milliseconds of one prefill, or one step, and of each
round's ratio of the two ways.  Results:
bench/results/joining_batch.json.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiments.generate_speed import real_prompts
from bench.record import RESULTS_DIR, write_result
from decode.steps import DecodeSteps
from model.config import PRESETS, preset
from model.gpt import GPT
from model.packed_linear import pack_for_inference
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.errors import UserError
from runtime.timing import Environment, Spread, environment

SERVER_ROWS = 16  # the server's default --max-batch-size: the rows of its cache


@dataclass
class JoiningBatchConfig:
    model: str = option("gpt2", "model preset (random weights)", choices=tuple(PRESETS))
    batch_sizes: list[int] = option([4, 12], "prompts of one length joining together", min=1, max=SERVER_ROWS)
    prompt_tokens: int = option(32, "each prompt's length", min=1)
    steps: int = option(31, "decode steps timed per form and round", min=1)
    rounds: int = option(5, "turns through every measurement", min=1)
    results_dir: Path = option(RESULTS_DIR, "where joining_batch.json goes")

    def __post_init__(self):
        check_options(self, UserError)
        block_size = preset(self.model).block_size
        if self.prompt_tokens + self.steps + 1 > block_size:
            raise UserError(f"--prompt-tokens {self.prompt_tokens} and --steps {self.steps} overflow the "
                            f"{self.model} context of {block_size}; ask for fewer")


@dataclass
class JoiningBatch:
    model: str
    prompt_tokens: int
    steps: int
    rounds: int
    prefill_ms: dict[str, dict[str, Spread]]  # batch -> "one pass" | "a pass per prompt" -> ms over rounds
    step_ms: dict[str, dict[str, Spread]]  # batch -> "aligned" | "ragged" -> ms per step over rounds
    # batch -> per round, the pass per prompt's time over one pass's, and the ragged step's over the aligned one's
    prefill_ratio: dict[str, Spread]
    step_ratio: dict[str, Spread]
    environment: Environment


def prefill_ms(steps: DecodeSteps, prompts: torch.Tensor, together: bool) -> float:
    start = time.perf_counter()
    if together:
        steps.logits(steps.new_cache(prompts.size(0), prompts.size(1)), prompts, 1)
    else:
        for row in prompts:
            steps.logits(steps.new_cache(1, prompts.size(1)), row[None], 1)
    return 1000 * (time.perf_counter() - start)


def step_ms(steps: DecodeSteps, prompts: torch.Tensor, aligned: bool, count: int) -> float:
    """Milliseconds per step of the prompts' rows over the first rows of a server-sized cache."""
    cache = steps.new_cache(SERVER_ROWS, steps.model.config.block_size).first_rows(prompts.size(0))
    steps.logits(cache, prompts, 1)
    token = prompts[:, -1:]
    start = time.perf_counter()
    for _ in range(count):
        cache.aligned = aligned  # rows of one length: exact in either form
        steps.logits(cache, token, 1)
    return 1000 * (time.perf_counter() - start) / count


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(JoiningBatchConfig, __doc__, argv)
    torch.manual_seed(0)
    model = GPT(preset(cfg.model)).eval()
    pack_for_inference(model)
    steps = DecodeSteps(model, torch.device("cpu"), "traced", SERVER_ROWS)
    prefill = {str(b): {"one pass": [], "a pass per prompt": []} for b in cfg.batch_sizes}
    step = {str(b): {"aligned": [], "ragged": []} for b in cfg.batch_sizes}
    with torch.inference_mode():
        for round_ in range(cfg.rounds + 1):  # the first round untimed: traces, kernel choices, first runs
            for batch in cfg.batch_sizes:
                prompts = real_prompts(batch, cfg.prompt_tokens)
                forms = [("one pass", True), ("a pass per prompt", False)]
                for name, together in forms if round_ % 2 else reversed(forms):
                    prefill[str(batch)][name].append(prefill_ms(steps, prompts, together))
                for name in ("aligned", "ragged") if round_ % 2 else ("ragged", "aligned"):
                    step[str(batch)][name].append(step_ms(steps, prompts, name == "aligned", cfg.steps))
    spreads = lambda table: {b: {form: Spread.of(ms[1:]) for form, ms in by_form.items()}
                             for b, by_form in table.items()}
    ratios = lambda table, slow, fast: {b: Spread.of([s / f for s, f in zip(by_form[slow][1:], by_form[fast][1:])])
                                        for b, by_form in table.items()}
    result = JoiningBatch(cfg.model, cfg.prompt_tokens, cfg.steps, cfg.rounds, spreads(prefill), spreads(step),
                          ratios(prefill, "a pass per prompt", "one pass"), ratios(step, "ragged", "aligned"),
                          environment(torch.device("cpu")))
    for batch in result.prefill_ms:
        p, s = result.prefill_ms[batch], result.step_ms[batch]
        pr, sr = result.prefill_ratio[batch], result.step_ratio[batch]
        print(f"batch {batch}: prefill {p['one pass'].median:.1f} ms in one pass, {p['a pass per prompt'].median:.1f} "
              f"ms a pass per prompt ({pr.median:.2f}x, rounds {pr.min:.2f}-{pr.max:.2f}); step "
              f"{s['aligned'].median:.2f} ms aligned, {s['ragged'].median:.2f} ms ragged ({sr.median:.2f}x, rounds "
              f"{sr.min:.2f}-{sr.max:.2f})")
    write_result(cfg.results_dir, "joining_batch", result)


if __name__ == "__main__":
    main()
