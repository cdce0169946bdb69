"""Each float product kernel timed alone and in the whole decode step, against the default kernels: what
model/kernel_choice.py's confirmation weighs.

    python -m bench.standalone.kernels_in_step     # GPT-2 124M, random weights, 12 rows; a few minutes

The kernel of each product shape (rows, in, out) is chosen by timing the candidates of model/packed_linear.py's
KERNELS alone, each over several layers' weights of that shape, and the fastest round of each counts.  A product
that wins alone can still slow the step around it, so the choices a trace times are confirmed in the step.  This
shows both sides of that, per shape and kernel: its time alone (the chooser's own timing, microseconds per product),
and the step's speed (generate()'s eager steps, new tokens per second) with that kernel at that shape and the
default rule (`default_kernel`) everywhere else, against the default rule everywhere, in interleaved rounds whose
order reverses every other round.  The weights go onto huge pages first, as in a process that has decoded a while.
The host's memory read and matmul rates are measured first (bench/peers/host_rates.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from bench.peers.host_rates import HostRates, measure
from bench.record import RESULTS_DIR, write_result
from decode.generate import generate
from decode.sampling import SamplingParams
from model import packed_linear
from model.config import PRESETS, preset
from model.gpt import GPT
from model.kernel_choice import KernelChoices
from model.packed_linear import PackedLinear, default_kernel, pack_for_inference
from runtime import huge_pages
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.errors import UserError
from runtime.timing import Environment, Spread, environment, paired_ratio, time_interleaved

PROMPT_TOKENS = 32
DEFAULT = "default"  # the side with the default rule at every shape


@dataclass
class KernelsInStepConfig:
    model: str = option("gpt2", "the preset, with random weights (seed 0)", choices=tuple(PRESETS))
    rows: int = option(12, "rows decoded together (a product's row count)", min=1)
    new_tokens: int = option(32, "tokens generated per row in each timed call", min=2)
    rounds: int = option(5, "interleaved rounds, after one untimed warm-up round", min=1)
    results_dir: Path = option(RESULTS_DIR / "kernels_in_step", "where kernels_in_step.json goes")

    def __post_init__(self):
        check_options(self, UserError)
        positions = preset(self.model).block_size
        if PROMPT_TOKENS + self.new_tokens > positions:
            raise UserError(f"--new-tokens {self.new_tokens} after a {PROMPT_TOKENS}-token prompt exceeds the "
                            f"{positions} positions of {self.model}; ask for at most {positions - PROMPT_TOKENS}")


@dataclass
class KernelAtShape:
    in_features: int
    out_features: int
    kernel: str
    default: bool  # the default rule's kernel at this shape
    alone_us: float  # the chooser's timing: its fastest round, per product (a round runs `products_per_round`)
    products_per_round: int  # PackedLinear.timed_weights: layers of this shape filling MEASURED_BYTES, at least one
    step_tokens_per_s: Spread  # the step with this kernel here and the default rule elsewhere, over the rounds
    step_over_default: float  # median of per-round ratios against the default rule everywhere (1.0 for the default)


@dataclass
class KernelsInStep:
    model: str
    rows: int
    threads: int
    new_tokens: int
    default_tokens_per_s: Spread
    kernels: list[KernelAtShape]
    host_rates: HostRates
    environment: Environment


def run(cfg: KernelsInStepConfig) -> KernelsInStep:
    rates = measure()
    print(f"host: read {rates.read_gb_per_s:.1f} GB/s, matmul {rates.matmul_gflop_per_s:.0f} GFLOP/s with "
          f"{rates.threads} thread(s)", flush=True)
    torch.manual_seed(0)
    model = GPT(preset(cfg.model)).eval()
    print(pack_for_inference(model), flush=True)
    threads = torch.get_num_threads()
    layers = {}  # (in, out, bias) -> one of the model's layers of that shape
    for module in model.modules():
        if isinstance(module, PackedLinear):
            layers.setdefault((module.in_features, module.out_features, module.bias is not None), module)
    per_round = {shape: len(layer.timed_weights()) for shape, layer in layers.items()}  # products per timed round
    prompt = torch.randint(0, model.config.vocab_size, (cfg.rows, PROMPT_TOKENS),
                           generator=torch.Generator().manual_seed(0))
    params = SamplingParams(max_new_tokens=cfg.new_tokens, temperature=0, stop_at_eot=False)
    chooser = KernelChoices(kept=None)  # times every candidate at each shape, as a first trace on a host does
    alone, sides = {}, {DEFAULT: {}}
    for shape, layer in layers.items():
        key = (cfg.rows, *shape, threads)
        chooser.choose(key, lambda layer=layer: layer._candidates(cfg.rows, threads))
        for kernel, seconds in chooser.timings[key].items():
            alone[shape, kernel] = seconds / per_round[shape]
            if kernel != default_kernel(cfg.rows, shape[1], threads):
                sides[shape, kernel] = {key: kernel}
    choices = packed_linear.CHOICES

    def with_kernels(kernels: dict) -> Callable[[], None]:
        def call():
            choices.chosen.clear()
            choices.chosen.update(kernels)
            generate(model, prompt, params, decode="dynamic")
        return call

    saved = dict(choices.chosen)
    try:
        with_kernels({})()
        huge_pages.collapse_in_background()  # as a process that has decoded a while (decode/trace.py)
        huge_pages.settled(timeout=120)
        seconds = time_interleaved({side: with_kernels(kernels) for side, kernels in sides.items()}, cfg.rounds,
                                   warmup=1, alternate=True, progress="kernels_in_step rounds")
    finally:
        choices.chosen.clear()
        choices.chosen.update(saved)
    tokens = cfg.rows * cfg.new_tokens
    speed = lambda side: Spread.of([tokens / s for s in seconds[side]])
    results = []
    for (shape, kernel), seconds_alone in alone.items():
        is_default = kernel == default_kernel(cfg.rows, shape[1], threads)
        side = DEFAULT if is_default else (shape, kernel)
        result = KernelAtShape(shape[0], shape[1], kernel, is_default, seconds_alone * 1e6, per_round[shape],
                               speed(side), paired_ratio(seconds[DEFAULT], seconds[side]))
        results.append(result)
        print(f"{shape[0]:>5} x {shape[1]:<6} {kernel:<10}{' (default)' if is_default else '':10} alone "
              f"{result.alone_us:8.1f} us; step {result.step_tokens_per_s.median:7.1f} new tokens/s, "
              f"{result.step_over_default:.3f}x the defaults", flush=True)
    return KernelsInStep(cfg.model, cfg.rows, threads, cfg.new_tokens, speed(DEFAULT), results, rates,
                         environment(torch.device("cpu")))


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(KernelsInStepConfig, __doc__, argv)
    write_result(cfg.results_dir, "kernels_in_step", run(cfg))


if __name__ == "__main__":
    main()
