"""Streamed tokens per second under each --stream-interval-ms, in the same interleaved rounds, beside a twin server.

    python -m bench.standalone.stream_interval      # GPT-2 124M, random int8 weights; 0 ms against 20 ms, 15 rounds

The server hands an event loop its streamed tokens at most once per `--stream-interval-ms` (serve/delivery.py).
This starts one `python -m serve` per interval on the same artifact (GPT-2 124M with random weights, saved once
under out/bench/stream_interval), and a second server with the first interval, the twin.  Each round, every server
in turn (the order reverses every other round) gets each --clients level: that many streaming /v1/completions
clients at once, each sending --requests requests in turn (bench/eval/loadtest.py's completion_body: a 32-token
prompt as token ids, greedy, exactly --new-tokens tokens).  A level's speed in a round is its new tokens over the
clients' wall time (first request sent, last stream closed).  Each interval is compared with the first one as the
median of per-round ratios.  The twin's ratio to the first server is the noise floor: two servers that differ in
nothing read that far apart.  The host's memory read and matmul rates are measured first.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path


from bench.eval.loadtest import checked, completion_body, run_level
from bench.experiment import WORK_ROOT
from bench.experiments.serve_speed import random_artifact
from bench.peers.host_rates import HostRates, measure
from bench.record import RESULTS_DIR, write_result
from model.config import PRESETS
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.device import choose_device
from runtime.errors import UserError
from runtime.timing import Environment, Spread, environment, paired_ratio, time_interleaved
from serve.launch import running_server

PROMPT = list(range(1000, 1032))  # 32 token ids, the same for every request: no server caches prompts by default
REQUEST_TIMEOUT_S = 600.0
TWIN = "twin"


@dataclass
class StreamIntervalConfig:
    model: str = option("gpt2", "the preset served, with random weights (seed 0)", choices=tuple(PRESETS))
    weights: str = option("int8", "the artifact served: fp32, or int8 as `quantize/dynamic.py --head int8`",
                          choices=("fp32", "int8"))
    intervals_ms: list[float] = option([0.0, 20.0], "the servers' --stream-interval-ms, one server each; the first "
                                                    "is the one the others are compared with, and has a twin",
                                       min=0, max=1000)
    clients: list[int] = option([1], "streaming clients at once, one level each", min=1)
    requests: int = option(2, "requests each client sends in turn, per level and round", min=1)
    new_tokens: int = option(128, "tokens per request (exactly: ignore_eos)", min=1)
    rounds: int = option(15, "timed rounds, after one untimed warm-up round", min=1)
    device: str = option("auto", "auto, cpu, cuda, ...: the servers' device (int8 is CPU-only)")
    results_dir: Path = option(RESULTS_DIR / "stream_interval", "where stream_interval.json goes")

    def __post_init__(self):
        check_options(self, UserError)
        if len(set(self.intervals_ms)) != len(self.intervals_ms):
            raise UserError(f"--intervals-ms names an interval twice: {' '.join(map(str, self.intervals_ms))}; "
                            f"the first interval's twin server is started anyway")


@dataclass
class IntervalLevel:
    interval_ms: float | str  # a server's --stream-interval-ms, or "twin" for the first one's second server
    clients: int
    tokens_per_s: Spread  # over the rounds
    over_first: float  # this server's speed over the first interval's, median of per-round ratios


@dataclass
class StreamInterval:
    model: str
    weights: str
    new_tokens: int
    requests_per_client: int
    levels: list[IntervalLevel]
    host_rates: HostRates
    environment: Environment


def run(cfg: StreamIntervalConfig) -> StreamInterval:
    device = choose_device(cfg.device)
    if cfg.weights == "int8" and device.type != "cpu":
        raise UserError(f"--weights int8 runs PyTorch's int8 kernels, which are CPU-only; the device is {device}: "
                        f"use --weights fp32 or --device cpu")
    rates = measure()
    print(f"host: read {rates.read_gb_per_s:.1f} GB/s, matmul {rates.matmul_gflop_per_s:.0f} GFLOP/s with "
          f"{rates.threads} thread(s)", flush=True)
    artifact = random_artifact(cfg.model, WORK_ROOT / "stream_interval", cfg.weights)
    body = lambda i, new_tokens: completion_body(artifact.name, PROMPT, new_tokens)
    servers: list[float | str] = [*cfg.intervals_ms, TWIN]
    first = cfg.intervals_ms[0]
    with contextlib.ExitStack() as stack:
        urls = {}
        for server in servers:
            interval = first if server == TWIN else server
            urls[server] = stack.enter_context(running_server(
                artifact, artifact.parent / f"server_{server}.log",
                ["--device", str(device), "--stream-interval-ms", str(interval), "--request-timeout-s",
                 str(REQUEST_TIMEOUT_S), "--max-batch-size", str(max(16, *cfg.clients))])).url

        def streaming(url: str, clients: int):
            def call():
                checked(asyncio.run(run_level(url, clients, clients * cfg.requests, cfg.new_tokens, REQUEST_TIMEOUT_S,
                                              REQUEST_TIMEOUT_S, body=body, route="/v1/completions")), cfg.new_tokens)
            return call

        seconds = time_interleaved({(server, n): streaming(urls[server], n) for server in servers
                                    for n in cfg.clients}, cfg.rounds, warmup=1, alternate=True,
                                   progress="stream_interval rounds")
    levels = []
    for n in cfg.clients:
        tokens = n * cfg.requests * cfg.new_tokens
        for server in servers:
            level = IntervalLevel(server, n, Spread.of([tokens / s for s in seconds[server, n]]),
                                  paired_ratio(seconds[first, n], seconds[server, n]))
            levels.append(level)
            name = "twin of the first" if server == TWIN else f"{server:g} ms"
            print(f"{n} client(s), {name}: {level.tokens_per_s.median:.1f} new tokens/s, {level.over_first:.3f}x "
                  f"the first ({first:g} ms), median of {cfg.rounds} paired rounds", flush=True)
    return StreamInterval(cfg.model, cfg.weights, cfg.new_tokens, cfg.requests, levels, rates,
                          environment(device))


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(StreamIntervalConfig, __doc__, argv)
    write_result(cfg.results_dir, "stream_interval", run(cfg))


if __name__ == "__main__":
    main()
