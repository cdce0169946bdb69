"""A greedy step's token choice, alone: decode/sampling.py's `plain_argmax` against torch's own reduction.

    python -m bench.standalone.greedy_argmax     # a few seconds; writes bench/results/greedy_argmax.json

Every greedy decoding step (generate(), the server, the scorecard) picks each row's best token from its logits.
`plain_argmax` reads float32 logits on the CPU through numpy's argmax; the other path is the one it keeps for other
devices and dtypes, `torch_argmax`: torch's `max` over the vocabulary (values and indices) and a finiteness check.
Both run on the same (rows, vocab) logits, a view of the last position of a (rows, 1, vocab) pass's output as a
step hands them, in interleaved rounds of many calls each, with this process's threads; both must pick the same
tokens.  The host's memory read and matmul rates are measured first (bench/peers/host_rates.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from bench.peers.host_rates import HostRates, measure
from bench.record import RESULTS_DIR, write_result
from decode.sampling import plain_argmax, torch_argmax
from model.config import GPTConfig
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.errors import UserError
from runtime.timing import Environment, Spread, environment, paired_ratio, time_interleaved


@dataclass
class GreedyArgmaxConfig:
    rows: list[int] = option([1, 4, 12], "batch sizes: rows of logits per call", min=1)
    vocab: int = option(GPTConfig().vocab_size, "logits per row (default: GPT-2's vocabulary, as sampling sees it)", min=1)
    calls: int = option(500, "calls per round and path", min=1)
    rounds: int = option(9, "interleaved rounds (the order of the two paths alternates)", min=1)
    results_dir: Path = option(RESULTS_DIR, "where greedy_argmax.json goes")

    def __post_init__(self):
        check_options(self, UserError)


@dataclass
class RowsTiming:
    rows: int
    plain_argmax_us: Spread  # microseconds per call, over the rounds
    torch_max_us: Spread
    speedup: float  # the median over rounds of torch's time / plain_argmax's


@dataclass
class GreedyArgmax:
    vocab: int
    calls_per_round: int
    timings: list[RowsTiming]
    host_rates: HostRates
    environment: Environment


def time_rows(rows: int, cfg: GreedyArgmaxConfig) -> RowsTiming:
    logits = torch.randn(rows, 1, cfg.vocab, generator=torch.Generator().manual_seed(rows))[:, -1]
    if plain_argmax(logits) != torch_argmax(logits):
        raise UserError(f"plain_argmax and torch's max chose different tokens for {rows} row(s); fix decode/sampling.py")

    def calls_of(choose):
        def calls():
            for _ in range(cfg.calls):
                choose(logits)
        return calls

    # one untimed round first: first calls allocate and start threads
    seconds = time_interleaved({"plain_argmax": calls_of(plain_argmax), "torch_max": calls_of(torch_argmax)},
                               cfg.rounds, warmup=1, alternate=True)
    us = {name: [s / cfg.calls * 1e6 for s in times] for name, times in seconds.items()}
    speedup = paired_ratio(us["torch_max"], us["plain_argmax"])
    timing = RowsTiming(rows, Spread.of(us["plain_argmax"]), Spread.of(us["torch_max"]), speedup)
    print(f"{rows:>3} row(s): plain_argmax {timing.plain_argmax_us.median:,.1f} us, torch's max "
          f"{timing.torch_max_us.median:,.1f} us per call; {speedup:.2f}x (median of {cfg.rounds} paired rounds)",
          flush=True)
    return timing


def run(cfg: GreedyArgmaxConfig) -> GreedyArgmax:
    rates = measure()
    print(f"host: read {rates.read_gb_per_s:.1f} GB/s, matmul {rates.matmul_gflop_per_s:.0f} GFLOP/s with "
          f"{rates.threads} thread(s)", flush=True)
    timings = [time_rows(rows, cfg) for rows in cfg.rows]
    return GreedyArgmax(cfg.vocab, cfg.calls, timings, rates, environment(torch.device("cpu")))


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(GreedyArgmaxConfig, __doc__, argv)
    write_result(cfg.results_dir, "greedy_argmax", run(cfg))


if __name__ == "__main__":
    main()
