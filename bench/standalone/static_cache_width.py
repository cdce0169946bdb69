"""A captured one-row decode step's time by the width of its static KV cache: the server's cache spans the model's
whole context, generate()'s only the prompt and the new tokens, and a captured step attends every column.

    python -m bench.standalone.static_cache_width --device cuda   # GPT-2 124M: 144 columns (16 + 128) and 1024

For each --widths entry (in turns, --rounds times), a fresh cache of that many columns takes a 16-token prompt, the
step is captured (decode="cuda-graph"; "static" eager steps off a GPU, the same fixed shapes), and --steps steps are
timed after a few untimed ones, the device synchronised before and after.  Results:
bench/results/static_cache_width.json.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.record import RESULTS_DIR, write_result
from decode.steps import DecodeSteps
from model.config import PRESETS, preset
from model.gpt import GPT
from model.packed_linear import pack_for_inference
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.device import choose_device
from runtime.errors import UserError
from runtime.timing import Environment, Spread, environment

PROMPT_TOKENS = 16
UNTIMED_STEPS = 4


@dataclass
class StaticCacheWidthConfig:
    model: str = option("gpt2", "model preset (random weights)", choices=tuple(PRESETS))
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    widths: list[int] = option([144, 1024], "static cache widths (columns) timed", min=PROMPT_TOKENS + 1)
    steps: int = option(100, "steps timed per width and round", min=1)
    rounds: int = option(2, "turns through every width", min=1)
    results_dir: Path = option(RESULTS_DIR, "where static_cache_width.json goes")

    def __post_init__(self):
        check_options(self, UserError)
        block_size = preset(self.model).block_size
        if max(self.widths) > block_size:
            raise UserError(f"--widths {max(self.widths)} exceeds the {self.model} context of {block_size}")
        if PROMPT_TOKENS + UNTIMED_STEPS + self.steps > min(self.widths):
            raise UserError(f"--steps {self.steps} after the {PROMPT_TOKENS}-token prompt overflows the "
                            f"{min(self.widths)}-column cache; ask for fewer steps or wider caches")


@dataclass
class StaticCacheWidth:
    model: str
    decode: str
    step_ms: dict[str, Spread]  # by width, over rounds
    environment: Environment


def step_ms(model: GPT, device: torch.device, decode: str, width: int, steps: int) -> float:
    """Milliseconds per one-row step over a fresh cache of `width` columns."""
    runner = DecodeSteps(model, device, decode, 1)
    cache = runner.new_cache(1, width)
    runner.logits(cache, torch.arange(PROMPT_TOKENS, device=device)[None], 1)
    token = torch.zeros(1, 1, dtype=torch.long, device=device)
    for _ in range(UNTIMED_STEPS):  # a capture's first run and the capture itself among them
        runner.logits(cache, token, 1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        runner.logits(cache, token, 1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 1000 * (time.perf_counter() - start) / steps


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(StaticCacheWidthConfig, __doc__, argv)
    device = choose_device(cfg.device)
    decode = "cuda-graph" if device.type == "cuda" else "static"
    torch.manual_seed(0)
    model = GPT(preset(cfg.model)).to(device).eval()
    pack_for_inference(model)
    times: dict[int, list[float]] = {width: [] for width in cfg.widths}
    with torch.inference_mode():
        for _ in range(cfg.rounds):
            for width in cfg.widths:
                times[width].append(step_ms(model, device, decode, width, cfg.steps))
    result = StaticCacheWidth(cfg.model, decode, {str(width): Spread.of(t) for width, t in times.items()},
                              environment(device))
    for width, spread in result.step_ms.items():
        print(f"{decode} step over a static cache of {width} columns: {spread.median:.3f} ms")
    write_result(cfg.results_dir, "static_cache_width", result)


if __name__ == "__main__":
    main()
