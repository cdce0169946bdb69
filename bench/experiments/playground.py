"""The playground page (GET /): what it weighs, its first token against a plain streaming client's, and what it
costs the server.

    python -m bench.experiments playground          # GPT-2 124M config, random weights; needs Debian's chromium

The model is saved as an artifact and served by two `python -m serve` processes with their defaults; a headless
chromium (bench/browser.py) opens the page on one of them, never on the other.  Each round:

- opens the page in a fresh browser context (no cache): the weight is the bytes of every file it loads (GET / and
  its scripts and stylesheet, as served), once it has read the server's limits and polled /metrics;
- first token: the page generates (the form's fields as below; it asks for a stream and `logprobs`) and the load
  test's client (bench/eval/loadtest.py's one_request) sends the page's own request body, in turns, the order
  reversed every other round.  The page's time runs from its form's submit event to the first shaded token in its
  document (performance.now(), bench/browser.py's TOKEN_TIMELINE); the client's from sending the request to reading
  the first token event;
- cost: one non-streaming /generate request (`ignore_eos`: --cost-tokens tokens) timed by an httpx client with
  the page open and idle (its live panel polling /metrics), then, the page closed, right after on the same server
  and on the server no page was ever opened on, those two in turns.

The first round is not timed.  Every figure is a median over the rounds; the ratios are medians of per-round
ratios; the 1-minute load average is recorded before every round.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from bench.browser import TOKEN_TIMELINE, browser_missing, chromium
from bench.experiment import Experiment, ExperimentError, RandomWeightsSettings
from bench.eval.loadtest import PROMPTS, one_request
from bench.experiments.serve_speed import random_artifact
from bench.plots import bars, finish, plt
from bench.report_page import Page, decode_path, spread, timed_as
from runtime.cli import non_default_flags, option
from runtime.timing import Environment, Spread, environment, paired_ratio
from serve.launch import ServerProcess

CLIENTS = ("page", "client")
CONDITIONS = ("no page ever opened", "page opened and closed", "page open")
REQUEST_TIMEOUT_S = 120.0
STARTUP_TIMEOUT_S = 300.0


@dataclass
class Settings(RandomWeightsSettings):
    rounds: int = option(10, "timed rounds, each with every client and condition once (after one untimed round)",
                         min=1)
    first_token_tokens: int = option(8, "max_new_tokens of the first-token requests", min=1)
    cost_tokens: int = option(32, "tokens of each request timed for the cost", min=1)


@dataclass
class PageFile:
    path: str
    bytes: int


@dataclass
class PlaygroundResult:
    model: str
    files: list[PageFile]  # as the page loaded them
    page_kb: float  # their sum, in KB (1,000 bytes)
    rounds: int
    request: dict  # the page's first-token request, which the client sent too
    first_token_ms: dict[str, Spread]  # by client (CLIENTS)
    first_token_rounds_ms: dict[str, list[float]]  # by client, each timed round's
    page_minus_client_ms: Spread  # per round: the page's first token minus the client's
    cost_tokens: int
    latency_ms: dict[str, Spread]  # the cost request's, by condition (CONDITIONS)
    over_no_page: dict[str, float]  # each condition's latency over the first's, median of per-round ratios
    load_average_1m: Spread
    command: str
    environment: Environment


class Playground:
    """The page in a headless chromium, each time in a fresh context, on one server."""

    def __init__(self, browser, url: str):
        from playwright.sync_api import expect
        self.browser, self.url, self.expect = browser, url, expect

    @contextlib.contextmanager
    def opened(self):
        """(the page, the files it loaded) once it has read the server's limits and polled /metrics; closed on
        leaving the block."""
        context = self.browser.new_context()
        try:
            page = context.new_page()
            page.add_init_script(TOKEN_TIMELINE)
            loaded = []
            page.on("response", lambda response: loaded.append(response)
                    if re.fullmatch(r"/|/playground/.+", response.url.removeprefix(self.url)) else None)
            page.goto(self.url)
            self.expect(page.locator("#limits-top_k")).not_to_be_empty()
            self.expect(page.locator("#now-cancelled")).not_to_have_text("–")
            yield page, [PageFile(r.url.removeprefix(self.url), len(r.body())) for r in loaded]
        finally:
            context.close()

    def first_token_ms(self, page, fields: dict) -> tuple[float, dict]:
        """Generate with `fields` typed in: (ms from the submit to the first token shown, the request's body)."""
        for name, value in fields.items():
            page.fill(f"#{name}", str(value))
        with page.expect_request(lambda request: request.url.endswith("/generate")) as sent:
            page.click("#generate")
        self.expect(page.locator("#status")).to_have_text(re.compile("^done"))
        timeline = page.evaluate("window.tokenTimeline")
        first = next(at for at, count in timeline["shown"] if count)
        return first - timeline["submitted"], json.loads(sent.value.post_data)


def client_first_token_ms(url: str, body: dict) -> float:
    # On a thread of its own: Playwright's synchronous API keeps an event loop running on this one.
    with ThreadPoolExecutor(max_workers=1) as thread:
        outcome = thread.submit(asyncio.run, one_request(url, body, REQUEST_TIMEOUT_S)).result()
    if outcome.error or outcome.ttft_s is None:
        raise ExperimentError(f"the client's streamed request failed: {outcome.status} {outcome.error}")
    return 1000 * outcome.ttft_s


def measure(settings: Settings, work_dir: Path) -> PlaygroundResult:
    missing = browser_missing()
    if missing:
        raise ExperimentError(f"the playground experiment drives a browser: {missing}")
    artifact = random_artifact(settings.model, work_dir)
    fields = {"prompt": PROMPTS[0], "max_new_tokens": settings.first_token_tokens, "temperature": 0.8, "seed": 1}
    cost_body = {"prompt": PROMPTS[0], "max_new_tokens": settings.cost_tokens, "temperature": 0.8, "seed": 1,
                 "ignore_eos": True}
    first_token: dict[str, list[float]] = {client: [] for client in CLIENTS}
    latency: dict[str, list[float]] = {condition: [] for condition in CONDITIONS}
    loads: list[float] = []
    files: list[PageFile] = []
    request: dict = {}
    with contextlib.ExitStack() as stack:
        servers = {name: ServerProcess(artifact, work_dir / f"server_{name}.log") for name in ("bare", "paged")}
        for server in servers.values():
            stack.callback(server.stop)
        for server in servers.values():
            server.wait_until_healthy(STARTUP_TIMEOUT_S)
        playground = Playground(stack.enter_context(chromium()), servers["paged"].url)
        client = stack.enter_context(httpx.Client(timeout=REQUEST_TIMEOUT_S))

        def cost_ms(server: ServerProcess) -> float:
            start = time.perf_counter()
            client.post(f"{server.url}/generate", json=cost_body).raise_for_status()
            return 1000 * (time.perf_counter() - start)

        # The page goes first in the untimed round: its request is what the client sends from then on.
        closed = {"page opened and closed": servers["paged"], "no page ever opened": servers["bare"]}
        for round_ in range(settings.rounds + 1):
            loads.append(os.getloadavg()[0])
            first, ms = {}, {}
            with playground.opened() as (page, loaded):
                files = files or loaded
                for who in CLIENTS if round_ % 2 == 0 else reversed(CLIENTS):
                    if who == "page":
                        first[who], request = playground.first_token_ms(page, fields)
                    else:
                        first[who] = client_first_token_ms(servers["paged"].url, request)
                ms["page open"] = cost_ms(servers["paged"])
            for condition in closed if round_ % 2 == 0 else reversed(closed):
                ms[condition] = cost_ms(closed[condition])
            print(f"round {round_}/{settings.rounds}{' (untimed)' if round_ == 0 else ''}: first token: page "
                  f"{first['page']:.1f} ms, client {first['client']:.1f} ms; {settings.cost_tokens} tokens: "
                  + ", ".join(f"{condition} {ms[condition]:.0f} ms" for condition in CONDITIONS), flush=True)
            if round_ > 0:
                for who in CLIENTS:
                    first_token[who].append(first[who])
                for condition in CONDITIONS:
                    latency[condition].append(ms[condition])
    base = latency[CONDITIONS[0]]
    return PlaygroundResult(
        settings.model, files, sum(f.bytes for f in files) / 1000, settings.rounds, request,
        {who: Spread.of(first_token[who]) for who in CLIENTS}, first_token,
        Spread.of([p - c for p, c in zip(first_token["page"], first_token["client"])]), settings.cost_tokens,
        {condition: Spread.of(latency[condition]) for condition in CONDITIONS},
        {condition: paired_ratio(latency[condition], base) for condition in CONDITIONS[1:]}, Spread.of(loads),
        " ".join(["python -m bench.experiments playground", *non_default_flags(settings)]),
        environment(torch.device("cpu")))


def plot(result: PlaygroundResult):
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    rounds = range(1, result.rounds + 1)
    for who, ms in result.first_token_rounds_ms.items():  # as the result names them (httpx, before the load test's own)
        left.plot(rounds, ms, marker="o", label=who)
    left.set_xlabel("round")
    left.set_xticks(list(rounds))
    left.set_ylabel("ms to the first token")
    left.set_title("first token: the page against a client")
    left.legend()
    bars(right, range(len(CONDITIONS)), [result.latency_ms[c] for c in CONDITIONS])
    right.set_xticks(range(len(CONDITIONS)), ["no page\never opened", "page opened\nand closed", "page\nopen"])
    right.set_ylabel(f"ms per {result.cost_tokens}-token request")
    right.set_title("the server's latency, by the page's state")
    return finish(fig, (left, right), grid="y")


def section(res: PlaygroundResult, page: Page) -> None:
    page.add(f"The playground page on {res.model} (random weights), {res.rounds} rounds (load average "
             f"{spread(res.load_average_1m, 2)}); `{res.command}`.\n")
    page.add(f"Weight: {res.page_kb:.1f} KB in {len(res.files)} files, as served: "
             + ", ".join(f"`{f.path}` {f.bytes / 1000:.1f} KB" for f in res.files) + ".\n")
    page.add(timed_as(f"`python -m serve` with its defaults, {decode_path('auto')}",
                      "the two servers started at once, so their start-up warm-ups overlapped (2 processes); the "
                      "first round is untimed"))
    page.table(["first token", "ms, median (min-max)"],
               [[who, spread(ms)] for who, ms in res.first_token_ms.items()]
               + [["page minus client, per round", spread(res.page_minus_client_ms)]])
    page.table(["condition", f"ms per {res.cost_tokens}-token request, median (min-max)", "over no page (paired)"],
               [[c, spread(res.latency_ms[c], 0), "1" if c == CONDITIONS[0] else f"{res.over_no_page[c]:.3f}x"]
                for c in CONDITIONS])


EXPERIMENT = Experiment(
    name="playground", title="The playground page: weight, first token, cost", about=__doc__, settings=Settings,
    quick=Settings(rounds=5), full=Settings(), result=PlaygroundResult, measure=measure, plot=plot,
    section=section)
