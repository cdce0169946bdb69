"""The server's side of `python -m bench.experiments speculative`: `python -m serve --draft` against the same
server without a draft, on the experiment's trained target.

Two servers load the target (one with `--draft FOLDER --draft-tokens K`), and each round sends every level's
streaming `/generate` requests (the load test's prompts, which differ in length, going on past end-of-text so
that each makes exactly the tokens asked for), greedy and sampled, to both, in turns.  Throughput is a level's new
tokens over the clients' wall time, from the first request sent to the last stream closed; the speed-up is the
median of per-round paired ratios; acceptance comes from the draft server's /metrics counters, read after each
level (outside its wall time).
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path


from bench.eval.loadtest import checked, exact_request_body, level_name, run_level, server_metrics
from runtime.timing import Spread, paired_ratio, time_interleaved
from serve.launch import ServerProcess

REQUEST_TIMEOUT_S = 600.0
STARTUP_TIMEOUT_S = 120.0
SAMPLED = "sampled"
GREEDY = "greedy"


@dataclass
class ServerLevel:
    clients: int
    decoding: str  # greedy, or sampled as serve_speed's requests are (temperature 0.8, top-k 200, a seed each)
    alone_tokens_per_s: Spread  # the server without a draft
    speculative_tokens_per_s: Spread
    speedup: float  # median of per-round paired ratios
    alone_latency_ms: float  # median request latency over every timed round
    speculative_latency_ms: float
    acceptance_rate: float  # draft tokens accepted over proposed, timed rounds


@dataclass
class ServerComparison:
    draft: str
    draft_tokens: int
    new_tokens: int
    rounds: int
    levels: list[ServerLevel]


def request_body(decoding: str):
    """Request i's body: the load test's sampled request, or the same prompt decoded greedily."""
    def body(i: int, max_new_tokens: int) -> dict:
        sampled = exact_request_body(i, max_new_tokens)
        return sampled if decoding == SAMPLED else {**sampled, "temperature": 0}
    return body


def draft_counters(url: str) -> list[float]:
    """The draft server's proposed and accepted draft tokens so far."""
    return server_metrics(url, "serve_draft_tokens_proposed_total", "serve_draft_tokens_accepted_total")


def compare_servers(target: Path, draft_name: str, draft: Path, draft_tokens: int, clients: list[int],
                    new_tokens: int, rounds: int, work_dir: Path) -> ServerComparison:
    server_args = ["--device", "cpu", "--max-batch-size", str(max(clients)), "--request-timeout-s",
                   str(REQUEST_TIMEOUT_S)]
    keys = [(decoding, n) for decoding in (GREEDY, SAMPLED) for n in clients]
    runs = {(side, *key): [] for side in ("alone", "speculative") for key in keys}
    counts = {key: [0.0, 0.0] for key in keys}  # proposed, accepted in the timed rounds

    def level(side: str, url: str, decoding: str, n: int):
        def call():
            before = draft_counters(url) if side == "speculative" else None
            result = asyncio.run(run_level(url, n, n, new_tokens, REQUEST_TIMEOUT_S, REQUEST_TIMEOUT_S,
                                           body=request_body(decoding)))
            runs[side, decoding, n].append(checked(result, new_tokens))
            if before is not None and len(runs[side, decoding, n]) > 1:  # the first round warms up
                after = draft_counters(url)
                counts[decoding, n][0] += after[0] - before[0]
                counts[decoding, n][1] += after[1] - before[1]
        return call

    with contextlib.ExitStack() as servers:
        # Both start at once (each loads its models and traces its steps), then each is waited for.
        alone, speculative = ServerProcess(target, work_dir / "server_alone.log", server_args), ServerProcess(
            target, work_dir / "server_speculative.log",
            [*server_args, "--draft", str(draft), "--draft-tokens", str(draft_tokens)])
        for server in (alone, speculative):
            servers.callback(server.stop)
        for server in (alone, speculative):
            server.wait_until_healthy(STARTUP_TIMEOUT_S)
        calls = {}
        for decoding, n in keys:
            calls["alone", decoding, n] = level("alone", alone.url, decoding, n)
            calls["speculative", decoding, n] = level("speculative", speculative.url, decoding, n)
        time_interleaved(calls, rounds, warmup=1, alternate=True, progress="speculative server rounds")

    levels = []
    for decoding, n in keys:
        wall = {side: [run.wall_s for run in runs[side, decoding, n][1:]] for side in ("alone", "speculative")}
        latency = {side: sorted(1000 * o.latency_s for run in runs[side, decoding, n][1:] for o in run.outcomes)
                   for side in wall}
        proposed, accepted = counts[decoding, n]
        levels.append(ServerLevel(
            n, decoding, Spread.of([n * new_tokens / s for s in wall["alone"]]),
            Spread.of([n * new_tokens / s for s in wall["speculative"]]),
            paired_ratio(wall["alone"], wall["speculative"]),
            Spread.of(latency["alone"]).median, Spread.of(latency["speculative"]).median,
            accepted / proposed if proposed else 0.0))
    comparison = ServerComparison(draft_name, draft_tokens, new_tokens, rounds, levels)
    for lv in levels:
        print(f"server, {level_name(lv.clients)}, {lv.decoding}: alone {lv.alone_tokens_per_s.median:.1f} tokens/s, "
              f"with the {draft_name} draft {lv.speculative_tokens_per_s.median:.1f} ({lv.speedup:.2f}x), "
              f"acceptance {lv.acceptance_rate:.1%}", flush=True)
    return comparison
