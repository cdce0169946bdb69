"""A one-off traced call with the huge-page pass started at its first traced step (as before 2026-11-27) against the
pass deferred to decode/trace.py's HUGE_PAGES_AFTER_STEPS (as now), each call in a fresh process.

    python bench/standalone/huge_pages_one_off.py                       # GPT-2 124M, 256 and 512 new tokens
    python bench/standalone/huge_pages_one_off.py --new-tokens 128 1000 --rounds 12

Each process builds the preset with random weights (seeded), packs it as sample.py does and times one greedy
`generate(decode="traced")` call on a 16-token prompt; the side "at the first step" sets HUGE_PAGES_AFTER_STEPS to
1 in its process, the other leaves it.  The kernel choices and trace timings are kept in files of this run's own
(decode/kept_ratios.py, model/kernel_choice.py), made by one untimed call first, so that no timed call chooses
kernels.  The two sides run in turns, the order reversed every other round; the ratio is the median over rounds of
(first step) / (deferred), each round paired.  The host's read and matmul rates are measured before and after.
Writes bench/results/huge_pages_one_off.json.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.peers.host_rates import HostRates, measure_in_process
from bench.processes import run_command
from bench.record import RESULTS_DIR, write_result
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.errors import UserError
from runtime.timing import Spread, paired_ratio

SIDES = {"at the first step": "1", "deferred": ""}  # HUGE_PAGES_AFTER_STEPS in the child ("": as the code has it)
AFTER_ENV = "HUGE_PAGES_ONE_OFF_AFTER"


@dataclass
class Config:
    model: str = option("gpt2", "model preset (random weights)")
    new_tokens: list[int] = option([256, 512], "tokens per call", min=2)
    rounds: int = option(8, "fresh processes per side and length", min=1)
    results_dir: Path = option(RESULTS_DIR, "where huge_pages_one_off.json goes")

    def __post_init__(self):
        check_options(self, UserError)


@dataclass
class Length:
    new_tokens: int
    call_s: dict[str, Spread]  # per side
    calls_s: dict[str, list[float]]  # per side, round by round
    first_step_over_deferred: float  # median of paired ratios of call times: above 1, deferring is faster


@dataclass
class HugePagesOneOff:
    command: str
    model: str
    rounds: int
    lengths: list[Length]
    load_average_1m: Spread
    host_before: HostRates
    host_after: HostRates


def one_call(model: str, new_tokens: int) -> float:
    """One traced call in this process, after building and packing the model: its seconds."""
    import torch

    import decode.trace
    from decode.generate import generate
    from decode.sampling import SamplingParams
    from model.config import preset
    from model.gpt import GPT
    from model.packed_linear import pack_for_inference
    if os.environ.get(AFTER_ENV):
        decode.trace.HUGE_PAGES_AFTER_STEPS = int(os.environ[AFTER_ENV])
    torch.manual_seed(0)
    gpt = GPT(preset(model)).eval()
    pack_for_inference(gpt)
    prompt = torch.randint(0, gpt.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    start = time.perf_counter()
    generate(gpt, prompt, SamplingParams(max_new_tokens=new_tokens, temperature=0, stop_at_eot=False), decode="traced")
    return time.perf_counter() - start


def timed_call(model: str, new_tokens: int, after: str, kept: dict[str, str]) -> float:
    done = run_command([sys.executable, __file__, "--child", model, str(new_tokens)],
                       env={**kept, AFTER_ENV: after}, timeout_s=900)
    if not done.ok:
        raise UserError(f"a timed call failed (exit code {done.returncode}):\n{done.output[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def measure(cfg: Config, folder: Path) -> HugePagesOneOff:
    kept = {"GPT2_TRACE_TIMINGS": str(folder / "trace_timings.json"),
            "GPT2_KERNEL_CHOICES": str(folder / "kernel_choices.json")}
    host_before = measure_in_process(threads=os.cpu_count() or 1)
    timed_call(cfg.model, 8, "", kept)  # chooses the kernels, kept for every timed call
    calls = {(n, side): [] for n in cfg.new_tokens for side in SIDES}
    loads = []
    for round_ in range(cfg.rounds):
        loads.append(os.getloadavg()[0])
        for n in cfg.new_tokens:
            for side in list(SIDES) if round_ % 2 == 0 else list(SIDES)[::-1]:
                calls[n, side].append(timed_call(cfg.model, n, SIDES[side], kept))
                print(f"round {round_ + 1}/{cfg.rounds}: {n} tokens, pass {side}: {calls[n, side][-1]:.2f} s",
                      flush=True)
    lengths = [Length(n, {side: Spread.of(calls[n, side]) for side in SIDES},
                      {side: calls[n, side] for side in SIDES},
                      paired_ratio(calls[n, "at the first step"], calls[n, "deferred"])) for n in cfg.new_tokens]
    command = "python bench/standalone/huge_pages_one_off.py " + " ".join(sys.argv[1:])
    return HugePagesOneOff(command.strip(), cfg.model, cfg.rounds, lengths, Spread.of(loads), host_before,
                           measure_in_process(threads=os.cpu_count() or 1))


@entry_point
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(one_call(argv[1], int(argv[2])))
        return
    cfg = parse_config(Config, __doc__, argv)
    with tempfile.TemporaryDirectory() as folder:
        result = measure(cfg, Path(folder))
    for length in result.lengths:
        print(f"{length.new_tokens} tokens: " + ", ".join(f"pass {side} {spread.median:.2f} s"
                                                          for side, spread in length.call_s.items())
              + f"; deferred is {length.first_step_over_deferred:.2f}x as fast")
    write_result(cfg.results_dir, "huge_pages_one_off", result)
    print(json.dumps({"host_before": vars(result.host_before), "host_after": vars(result.host_after)}))


if __name__ == "__main__":
    main()
