"""The playground (GET /) in a real browser: Playwright driving Debian's chromium (bench/browser.py) against a live
`python -m serve`, at 390 px wide, the narrowest the page is made for.

Without chromium or playwright the browser tests skip, and the run's summary says in one line what installs them
(tests/conftest.py); the page's files are still checked, over HTTP.  PLAYGROUND_SCREENSHOT=PATH has the streaming
test save a screenshot of the page there (docs/serving.md's, bench/results/playground_page.png), and PLAYGROUND_CHECKPOINT
serves that artifact instead of the random small model, so that the screenshot shows a trained model's tokens.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import httpx
import pytest

from bench.browser import TOKEN_TIMELINE, browser_missing, chromium, server_sent_events
from serve.config import API_KEY_ENV
from serve.launch import ServerProcess
from serve.playground_page import assets_folder, page_folder
from tests.conftest import save_small_artifact
from tests.test_serve_live import metric, wait_until

BLOCK_SIZE = 1024  # room for a generation long enough to stop midway
API_KEY = "playground-test-key"
SERVER_ARGS = ["--device", "cpu", "--threads", "1", "--decode", "dynamic"]
NARROWEST = {"width": 390, "height": 844}
BROWSER_MISSING = browser_missing()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return os.environ.get("PLAYGROUND_CHECKPOINT") or \
        save_small_artifact(tmp_path_factory.mktemp("playground") / "artifact", block_size=BLOCK_SIZE)


@pytest.fixture(scope="module")
def servers(checkpoint, tmp_path_factory):
    """The server the page is tried on; with a browser, also one that needs a key and decodes with a draft (the
    model itself), started alongside."""
    logs = tmp_path_factory.mktemp("playground_logs")
    started = [ServerProcess(checkpoint, logs / "open.log", SERVER_ARGS)]
    try:
        if BROWSER_MISSING is None:
            started.append(ServerProcess(checkpoint, logs / "keyed.log", [*SERVER_ARGS, "--draft", checkpoint],
                                         env={API_KEY_ENV: API_KEY}))
        for server in started:
            server.wait_until_healthy(120)
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def server(servers) -> ServerProcess:
    return servers[0]


@pytest.fixture(scope="module")
def browser():
    if BROWSER_MISSING:
        pytest.skip(f"browser tests skipped: {BROWSER_MISSING}")
    with chromium() as browser:
        yield browser


class Playground:
    """A fresh page on a server: what it logged as errors, and the steps the tests take."""

    def __init__(self, browser, url: str):
        from playwright.sync_api import expect
        self.expect = expect
        self.context = browser.new_context(viewport=NARROWEST)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))
        self.page.on("console", lambda message: message.type == "error" and self.errors.append(message.text))
        self.page.add_init_script(TOKEN_TIMELINE)
        self.page.goto(url)
        expect(self.page.locator("#limits-top_k")).not_to_be_empty()  # it has read the server's limits

    def fill(self, **fields) -> None:
        for name, value in fields.items():
            self.page.fill(f"#{name}", str(value))

    def generate(self) -> list[tuple[str, dict]]:
        """Click Generate, wait for the page to say it is done; the reply's events, as the browser received them."""
        with self.page.expect_response(lambda response: response.url.endswith("/generate")) as reply:
            self.page.click("#generate")
        self.expect(self.page.locator("#status")).to_have_text(re.compile("^done"))
        return server_sent_events(reply.value.text())

    def unexpected_errors(self, *statuses: int) -> list[str]:
        """Errors the page met, but for the browser's own line about each reply of these statuses."""
        allowed = [f"the server responded with a status of {status} " for status in statuses]
        return [e for e in self.errors if not any(a in e for a in allowed)]

    def overflowing(self) -> list[str]:
        """What sticks out of the viewport sideways (hidden elements have no box)."""
        return self.page.evaluate("""() => {
            const width = document.documentElement.clientWidth;
            const out = [...document.querySelectorAll("body *")].filter((e) => {
                const box = e.getBoundingClientRect();
                return box.width > 0 && (box.right > width + 0.5 || box.left < -0.5);
            }).map((e) => e.id || e.className || e.tagName);
            return document.documentElement.scrollWidth > width ? [...out, "the page scrolls sideways"] : out;
        }""")


@pytest.fixture
def playground(browser, server):
    playground = Playground(browser, server.url)
    yield playground
    playground.context.close()


def page_files() -> list[Path]:
    return [page_folder() / "index.html", *sorted(assets_folder().iterdir())]


def test_the_page_and_its_files_come_from_the_server_and_name_no_other_host(server):
    page = httpx.get(f"{server.url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    odd = httpx.get(f"{server.url}/", params={"prompt": "<script>", "x": "\x00"}, headers={"Accept": "nothing/here"})
    assert odd.status_code == 200 and odd.text == page.text  # the page takes no input
    loaded = re.findall(r'(?:src|href)="(/playground/[^"]+)"', page.text)
    imported = [f"/playground/{name}" for path in assets_folder().glob("*.js")
                for name in re.findall(r'from "\./([^"]+)"', path.read_text())]
    assert loaded and imported
    for path in {*loaded, *imported}:
        assert httpx.get(f"{server.url}{path}").status_code == 200, path
    for path in page_files():  # no build step, no CDN: nothing is fetched from another host
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]", path.read_text(), re.IGNORECASE), path


def test_tokens_stream_in_shaded_with_the_replys_latency(playground):
    page = playground.page
    playground.fill(prompt="The history of the city begins", max_new_tokens=120, temperature=0.8, seed=3)
    events = playground.generate()
    done = events[-1][1]
    assert events[-1][0] == "done"
    tokens = [data for name, data in events if name == "token" and data["token"] is not None]
    # Each token with text is one span shaded by its probability.
    shown = page.locator("#output .tok").evaluate_all("spans => spans.map(s => Number(s.dataset.probability))")
    assert shown == pytest.approx([math.exp(t["logprob"]) for t in tokens if t["text"]])
    assert page.locator("#output").inner_text() == "The history of the city begins" + done["text"]
    # They appeared in many steps while the reply streamed, not all at once at its end.
    appeared = sorted({count for _, count in page.evaluate("window.tokenTimeline.shown") if count})
    assert len(appeared) >= 3 and appeared[0] < len(shown) / 2, appeared
    # The latency shown is the reply's, figure for figure.
    latency = done["latency"]
    per_token = (latency["total_ms"] - latency["time_to_first_token_ms"]) / (done["tokens"] - 1)
    for key, value in [*latency.items(), ("per_token_ms", per_token)]:
        figure = page.locator(f"#latency-{key}")
        assert float(figure.get_attribute("data-value")) == pytest.approx(value, rel=1e-12), key
        assert abs(float(figure.inner_text().split()[0]) - value) <= 0.05 + 1e-9, key
    assert page.locator("#latency-tokens").inner_text() == str(done["tokens"])
    assert page.locator("#speculative").is_hidden()  # no draft on this server
    # By keyboard: into the output, then along its tokens, each showing its alternatives.
    page.focus("#output")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    second = [t for t in tokens if t["text"]][1]
    playground.expect(page.locator("#token-detail li")).to_have_count(5)
    assert page.locator("#token-detail li code").all_inner_texts() == \
        [a["text"].replace(" ", "\u2423").replace("\n", "\u23ce") for a in second["top_logprobs"]]
    assert playground.overflowing() == []
    assert playground.unexpected_errors() == []
    if os.environ.get("PLAYGROUND_SCREENSHOT"):
        take_screenshot(playground, os.environ["PLAYGROUND_SCREENSHOT"])


def take_screenshot(playground: Playground, path: str) -> None:
    """docs/serving.md's picture, at a desktop width: a generation that the live panel's polls see, then a word's
    alternatives shown."""
    page = playground.page
    page.set_viewport_size({"width": 1000, "height": 900})
    polls = page.locator("#chart-tokens polyline")
    playground.expect(polls).to_have_attribute("points", re.compile(r"(\S+ ){2}"))  # three polls in
    playground.fill(prompt="A list is", max_new_tokens=60, temperature=0.8, top_k=40, seed=2)
    playground.generate()
    points = polls.get_attribute("points").count(" ")
    playground.expect(polls).to_have_attribute("points", re.compile(rf"(\S+ ){{{points + 1}}}"))  # one more
    page.locator("#output .tok").filter(has_text=re.compile(r"\w{3}")).nth(3).hover()
    page.screenshot(path=path, full_page=True)


def test_stop_cancels_the_request_on_the_server(playground, server):
    page = playground.page
    cancelled = metric(server.url, "serve_requests_cancelled_total")
    generated = metric(server.url, "serve_generated_tokens_total")
    context = httpx.get(f"{server.url}/health").json()["context"]
    max_new_tokens = context - 16  # the prompt is shorter
    playground.fill(prompt="Once upon a time", max_new_tokens=max_new_tokens, seed=5)
    page.click("#generate")
    playground.expect(page.locator("#output .tok").first).to_be_visible()
    page.click("#stop-button")
    playground.expect(page.locator("#status")).to_have_text(re.compile("^stopped after"))
    assert wait_until(lambda: metric(server.url, "serve_requests_cancelled_total") == cancelled + 1)
    assert wait_until(lambda: httpx.get(f"{server.url}/health").json()["batch_size"] == 0)
    assert metric(server.url, "serve_generated_tokens_total") - generated < max_new_tokens
    assert page.locator("#generate").is_enabled() and page.locator("#stop-button").is_disabled()
    assert playground.unexpected_errors() == []


def test_a_bad_value_shows_the_servers_message_beside_its_field(playground, server):
    page = playground.page
    health = httpx.get(f"{server.url}/health").json()  # the limits shown are the server's
    assert f"fit the context of {health['context']}" in page.locator("#limits-max_new_tokens").inner_text()
    assert page.locator("#limits-top_k").inner_text().startswith(f"1–{health['vocab_size']}")
    prompt = "The history of the city begins"
    for field, value in [("temperature", 50), ("max_new_tokens", 100_000)]:
        refusal = httpx.post(f"{server.url}/generate", json={"prompt": prompt, field: value})
        assert refusal.status_code == 422 and refusal.json()["error"]["param"] == field
        playground.fill(prompt=prompt, **{field: value})
        page.click("#generate")
        playground.expect(page.locator(f"#error-{field}")).to_have_text(refusal.json()["error"]["message"])
        playground.expect(page.locator(f"#{field}")).to_be_focused()
        assert page.locator(f"#{field}").get_attribute("aria-invalid") == "true"
        playground.fill(**{field: ""})  # the server's default
    assert playground.overflowing() == []
    assert playground.unexpected_errors(422) == []


def test_a_key_protected_server_asks_for_its_key_and_keeps_it_out_of_the_url(browser, servers):
    keyed = servers[1]
    playground = Playground(browser, keyed.url)
    page = playground.page
    try:
        playground.expect(page.locator("#api_key")).to_be_focused()  # asked for at once
        page.fill("#api_key", "not-the-key")
        page.keyboard.press("Enter")
        page.click("#generate")
        refusal = httpx.post(f"{keyed.url}/generate", json={"prompt": "x"}, headers={"X-API-Key": "not-the-key"})
        playground.expect(page.locator("#error-api_key")).to_have_text(refusal.json()["error"]["message"])
        page.fill("#api_key", API_KEY)
        page.keyboard.press("Enter")
        playground.fill(max_new_tokens=24, seed=1)
        done = playground.generate()[-1][1]
        assert page.evaluate("sessionStorage.getItem('gpt2-serve-api-key')") == API_KEY
        assert page.evaluate("localStorage.length") == 0 and API_KEY not in page.url
        # A draft is loaded: the request's speculative counters are shown.
        assert page.locator("#speculative").is_visible()
        for key, value in done["speculative"].items():
            assert float(page.locator(f"#speculative-{key}").get_attribute("data-value")) == pytest.approx(value)
        assert playground.overflowing() == []
        assert playground.unexpected_errors(401) == []
    finally:
        playground.context.close()
