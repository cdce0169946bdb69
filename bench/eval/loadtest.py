"""Load-test a running generation server from loopback at several concurrency levels.

    python bench/eval/loadtest.py --url http://127.0.0.1:8000
    python bench/eval/loadtest.py --checkpoint out/demo/train        # starts its own server on a free port

Each level sends max(--min-requests, concurrency) streaming /generate requests, at most
`concurrency` at a time, and starts no new request after --level-time-limit seconds.  Request
i always has the same prompt and seed, so levels that send the same number of requests send
the same requests: with the default 12, concurrency 12 and concurrency 1 compare the same 12
requests served together and one at a time.  Latency and time to first token are measured
by this client; throughput is generated tokens over the level's wall time.  A 503 (the
server's queue is full) is counted apart from errors.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

import httpx
import numpy as np

from bench.eval.stream_client import Answer, AnswerError, post_streaming
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.errors import UserError
from runtime.progress import ProgressBar

PROMPTS = [
    "The history of",
    "In 1998, the company announced that",
    "The module",
    "Scientists have long debated whether the",
    "She opened the door and",
    "The river flows through the valley, past the old mill, and",
]
COMPARE_CONCURRENCY = 12
DEFAULT_URL = "http://127.0.0.1:8000"


@dataclass
class Outcome:
    status: int  # HTTP status; 0 when the request failed before an answer
    latency_s: float = 0.0
    ttft_s: float | None = None
    tokens: int = 0
    error: str | None = None


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    wall_s: float
    outcomes: list[Outcome] = field(default_factory=list)
    not_started: int = 0  # requests skipped because the level's time limit passed

    @property
    def ok(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == 200 and o.error is None]

    @property
    def overloaded(self) -> int:
        return sum(o.status == 503 for o in self.outcomes)

    @property
    def errors(self) -> int:
        return len(self.outcomes) - len(self.ok) - self.overloaded

    @property
    def tokens_per_s(self) -> float:
        return sum(o.tokens for o in self.ok) / self.wall_s if self.wall_s > 0 else 0.0

    def latency_ms(self, q: float) -> float:
        values = [o.latency_s for o in self.ok]
        return 1000 * float(np.percentile(values, q)) if values else float("nan")

    def ttft_ms(self, q: float) -> float:
        values = [o.ttft_s for o in self.ok if o.ttft_s is not None]
        return 1000 * float(np.percentile(values, q)) if values else float("nan")


def request_body(i: int, max_new_tokens: int) -> dict:
    return {"prompt": PROMPTS[i % len(PROMPTS)], "max_new_tokens": max_new_tokens, "temperature": 0.8,
            "top_k": 200, "seed": i, "stream": True}


def exact_request_body(i: int, max_new_tokens: int) -> dict:
    """Request i (`request_body`), going on past end-of-text so that it makes exactly `max_new_tokens` tokens:
    what the benchmarks send, so that every server makes the same tokens."""
    return {**request_body(i, max_new_tokens), "ignore_eos": True}


def completion_body(model: str, prompt: list[int], max_new_tokens: int) -> dict:
    """An OpenAI-style streaming /v1/completions request that every OpenAI-compatible server takes alike (ours,
    llama.cpp's llama-server, vLLM): the prompt as token ids (no server's tokenizer in the way), greedy, exactly
    `max_new_tokens` tokens (`ignore_eos`), the token count in the stream's last event."""
    return {"model": model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}


def level_name(clients: int) -> str:
    return f"{clients} client{'s' if clients > 1 else ''}"


def server_metrics(url: str, *names: str) -> list[float]:
    """The values of the counters `names` in a server's /metrics text, in that order."""
    values = dict(line.rsplit(" ", 1) for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
                  if line and not line.startswith("#"))
    missing = [name for name in names if name not in values]
    if missing:
        raise LoadTestError(f"{url}/metrics has no {', '.join(missing)}")
    return [float(values[name]) for name in names]


def checked(level: LevelResult, new_tokens: int) -> LevelResult:
    """A level in which every request made exactly `new_tokens` tokens, or an error naming the first failure."""
    for outcome in level.outcomes:
        if outcome.status != 200 or outcome.error or outcome.tokens != new_tokens:
            raise LoadTestError(f"a request at concurrency {level.concurrency} failed: status {outcome.status}, "
                                f"{outcome.tokens} of {new_tokens} tokens, {outcome.error or 'no error text'}")
    return level


async def one_request(url: str, body: dict, timeout_s: float, route: str = "/generate") -> Outcome:
    """One streaming request to `route`: this server's /generate, or an OpenAI-style /v1/completions.  Its events
    are read once the answer has ended, each timed by the read that brought it (bench/eval/stream_client.py)."""
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            answer = await post_streaming(url, route, body)
    except (OSError, AnswerError, TimeoutError) as e:
        return Outcome(0, time.perf_counter() - start, error=f"{type(e).__name__}: {e}")
    return outcome_of(answer, route, start)


def outcome_of(answer: Answer, route: str, start: float) -> Outcome:
    """What `answer`, to a request to `route` sent at `start`, says: an error's text, or the stream's first token
    time, token count and end.  A stream whose events this load test cannot read is an error, not a crash."""
    if answer.status != 200:
        return Outcome(answer.status, answer.ended_at - start, error=answer.text()[:200])
    outcome = Outcome(200)
    try:
        (read_completion_stream if route == "/v1/completions" else read_generate_stream)(answer, outcome, start)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:  # json.loads, or an event's shape
        outcome.error = f"an event of the stream is not one the load test reads ({type(e).__name__}: {e})"[:200]
        outcome.latency_s = answer.ended_at - start
    return outcome


def read_generate_stream(answer: Answer, outcome: Outcome, start: float) -> None:
    """This server's /generate event stream into `outcome`: the first token's time, the token count of its `done`
    event, the time of its end."""
    event = None
    for at, line in answer.lines():
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = json.loads(line.removeprefix("data: "))
            if event == "token" and data["token"] is not None and outcome.ttft_s is None:
                outcome.ttft_s = at - start
            elif event == "done":
                outcome.tokens = data["tokens"]
            elif event == "error":
                outcome.error = data["error"]["message"]
    outcome.latency_s = answer.ended_at - start
    if event != "done" and outcome.error is None:
        outcome.error = "the stream ended without a done event"


def read_completion_stream(answer: Answer, outcome: Outcome, start: float) -> None:
    """An OpenAI completion stream's events into `outcome`: the first text's time, the token count of its usage
    event, the time of its `[DONE]`."""
    done = False
    for at, line in answer.lines():
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            done = True
            outcome.latency_s = at - start
            break
        event = json.loads(data)
        if "error" in event:
            outcome.error = str(event["error"])[:200]
        if event.get("choices") and event["choices"][0].get("text") and outcome.ttft_s is None:
            outcome.ttft_s = at - start
        if event.get("usage"):
            outcome.tokens = event["usage"]["completion_tokens"]
    if not done:
        outcome.latency_s = answer.ended_at - start
        if outcome.error is None:
            outcome.error = "the stream ended without [DONE]"


async def run_level(url: str, concurrency: int, requests: int, max_new_tokens: int, time_limit_s: float,
                    request_timeout_s: float, body: Callable[[int, int], dict] = request_body,
                    route: str = "/generate") -> LevelResult:
    """`body(i, max_new_tokens)` is request i's JSON body (default: this load test's sampled requests), sent to
    `route` (one_request), each on a connection of its own."""
    gate = asyncio.Semaphore(concurrency)
    result = LevelResult(concurrency, requests, wall_s=0.0)
    progress = ProgressBar(total=requests, desc=f"concurrency {concurrency}", file=sys.stderr, leave=False)

    async def worker(i: int) -> None:
        async with gate:
            if time.perf_counter() - start > time_limit_s:
                result.not_started += 1
            else:
                result.outcomes.append(await one_request(url, body(i, max_new_tokens), request_timeout_s, route))
            progress.update()

    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(requests)))
    result.wall_s = time.perf_counter() - start
    progress.close()
    return result


async def run_levels(url: str, levels: list[int], min_requests: int, max_new_tokens: int, time_limit_s: float,
                     request_timeout_s: float) -> list[LevelResult]:
    # One request first, so that no level pays for the server's first-call warm-up.
    await run_level(url, 1, 1, max_new_tokens, time_limit_s, request_timeout_s)
    return [await run_level(url, c, max(min_requests, c), max_new_tokens, time_limit_s, request_timeout_s)
            for c in levels]


def format_table(results: list[LevelResult]) -> str:
    lines = ["| concurrency | requests | ok | 503 | errors | latency p50 / p95 / p99 ms | first token p50 / p95 / p99 ms "
             "| tokens/s | requests/s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        latency = " / ".join(f"{r.latency_ms(q):.0f}" for q in (50, 95, 99))
        ttft = " / ".join(f"{r.ttft_ms(q):.0f}" for q in (50, 95, 99))
        requests = f"{len(r.outcomes)}" + (f" (+{r.not_started} not started)" if r.not_started else "")
        lines.append(f"| {r.concurrency} | {requests} | {len(r.ok)} | {r.overloaded} | {r.errors} | {latency} | {ttft} "
                     f"| {r.tokens_per_s:.1f} | {len(r.ok) / r.wall_s:.2f} |")
    return "\n".join(lines)


def batching_speedup(results: list[LevelResult]) -> str | None:
    """Concurrency 12 against concurrency 1 when both levels sent the same requests."""
    by_level = {r.concurrency: r for r in results}
    alone, together = by_level.get(1), by_level.get(COMPARE_CONCURRENCY)
    if alone is None or together is None or alone.requests != together.requests:
        return None
    ratio = together.tokens_per_s / alone.tokens_per_s if alone.tokens_per_s else float("nan")
    return (f"{together.requests} requests at concurrency {COMPARE_CONCURRENCY}: {together.tokens_per_s:.1f} tokens/s; "
            f"the same {alone.requests} one at a time: {alone.tokens_per_s:.1f} tokens/s; speed-up {ratio:.2f}x")


class LoadTestError(UserError):
    """Settings the load test cannot run with."""


@dataclass
class LoadTestConfig:
    url: str = option(DEFAULT_URL, "a running server on loopback")
    checkpoint: str | None = option(None, "start `python -m serve` on this artifact "
                                          "instead of using --url")
    server_args: str = option("", "extra flags for the server --checkpoint starts")
    concurrency: str = option("1,4,12,32", "comma-separated levels")
    min_requests: int = option(12, "requests per level (at least the concurrency)", min=1)
    max_new_tokens: int = option(64, "tokens per request", min=1)
    level_time_limit: float = option(120.0, "seconds; no new requests after it")
    request_timeout: float = option(120.0, "seconds per request")
    json: Path | None = option(None, "also write the results here")

    def __post_init__(self):
        if self.checkpoint is not None and self.url != DEFAULT_URL:
            raise LoadTestError("give --url or --checkpoint, not both")
        if self.checkpoint is None:
            check_loopback(self.url)
        if not all(part.strip().isdigit() for part in self.concurrency.split(",")):
            raise LoadTestError(f"--concurrency must be comma-separated integers, got {self.concurrency!r}")
        if min(self.levels) < 1:
            raise LoadTestError(f"--concurrency levels must be at least 1, got {self.concurrency}")
        check_options(self, LoadTestError)

    @property
    def levels(self) -> list[int]:
        return [int(part) for part in self.concurrency.split(",")]


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise LoadTestError(f"--url {url} is not a loopback address; this load test only drives a server on this "
                            f"machine (127.0.0.1 or localhost)")


def report(cfg: LoadTestConfig, url: str) -> None:
    results = asyncio.run(run_levels(url, cfg.levels, cfg.min_requests, cfg.max_new_tokens, cfg.level_time_limit,
                                     cfg.request_timeout))
    print(f"load test of {url}: streaming /generate, {cfg.max_new_tokens} new tokens per request")
    print(format_table(results))
    speedup = batching_speedup(results)
    if speedup:
        print(speedup)
    if cfg.json:
        cfg.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    for r in results:
        for o in r.outcomes:
            if o.error and o.status != 503:
                print(f"error at concurrency {r.concurrency}: status {o.status}: {o.error}", file=sys.stderr)
                break


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(LoadTestConfig, __doc__, argv)
    if cfg.checkpoint is None:
        report(cfg, cfg.url.rstrip("/"))
        return
    from serve.launch import running_server
    with tempfile.TemporaryDirectory() as tmp, \
            running_server(Path(cfg.checkpoint), Path(tmp) / "server.log", cfg.server_args.split()) as server:
        health = httpx.get(f"{server.url}/health").json()
        print(f"server: {health['artifact']} model {health['checkpoint']} on {health['device']}, "
              f"max batch {health['max_batch_size']}")
        report(cfg, server.url)


if __name__ == "__main__":
    main()
