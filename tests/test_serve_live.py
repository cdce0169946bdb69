"""A real `python -m serve` on a free loopback port: streaming, batching equality, the openai client,
disconnects, random bad bodies, overload and graceful shutdown."""
from __future__ import annotations

import asyncio
import json
import random
import re
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from bench.eval.loadtest import checked, completion_body, format_table, run_level, run_levels
from serve.launch import LOOPBACK, running_server
from tests.conftest import save_small_artifact

BLOCK_SIZE = 256


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return save_small_artifact(tmp_path_factory.mktemp("serve_live") / "artifact", block_size=BLOCK_SIZE)


# Short enough that slow and surplus clients take seconds to test; no other test comes near either.
READ_TIMEOUT_S = 2
MAX_CONNECTIONS = 16


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve_live_log") / "server.log"
    with running_server(checkpoint, log, ["--device", "cpu", "--threads", "1", "--max-batch-size", "8",
                                          "--read-timeout-s", str(READ_TIMEOUT_S),
                                          "--max-connections", str(MAX_CONNECTIONS)]) as server:
        yield server


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def generate(url: str, body: dict) -> dict:
    response = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_stream_arrives_token_by_token(server):
    body = {"prompt": "Once upon a time", "max_new_tokens": 12, "seed": 7, "stream": True}
    events = []
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=60) as response:
        assert response.status_code == 200
        name = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
    tokens = [data for name, data in events if name == "token" and data["token"] is not None]
    done = events[-1][1]
    assert events[-1][0] == "done" and len(tokens) == done["tokens"] - (done["finish_reason"] == "eos")
    assert "".join(data["text"] for name, data in events if name == "token") == done["text"]


def test_concurrent_requests_batch_and_equal_running_alone(server):
    prompts = ["The history of", "A", "In 1998, the company announced that it would", "Hello world",
               "She opened the door and saw", "Numbers: 1, 2, 3,", "Why", "The river flows through the valley"]
    settings = [{"temperature": 0}, {"temperature": 0.9, "seed": 1}, {"temperature": 1.1, "top_k": 50, "seed": 2},
                {"temperature": 0.7, "top_p": 0.9, "seed": 3}]
    bodies = [{"prompt": p, "max_new_tokens": 8 + 5 * i, **settings[i % 4]} for i, p in enumerate(prompts)]
    alone = [generate(server.url, body)["text"] for body in bodies]
    steps_before = metric(server.url, "serve_decode_batch_size_count")
    single_before = metric(server.url, 'serve_decode_batch_size_bucket{le="1"}')
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = [r["text"] for r in pool.map(lambda b: generate(server.url, b), bodies)]
    assert together == alone
    steps = metric(server.url, "serve_decode_batch_size_count") - steps_before
    single = metric(server.url, 'serve_decode_batch_size_bucket{le="1"}') - single_before
    assert single < steps, "no decode step ran more than one sequence"


def test_openai_client_works_unchanged(server, checkpoint):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == [Path(checkpoint).name]  # the folder's name, not its path
    kwargs = dict(model=Path(checkpoint).name, prompt="The meaning of life is", max_tokens=10, temperature=0.9, seed=11)
    first = client.completions.create(n=2, **kwargs)
    assert len(first.choices) == 2 and first.choices[0].text != first.choices[1].text
    assert first.usage.prompt_tokens == 5 and first.usage.total_tokens == 5 + first.usage.completion_tokens
    assert [c.text for c in client.completions.create(n=2, **kwargs).choices] == [c.text for c in first.choices]
    streamed = client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
    chunks = list(streamed)
    assert "".join(c.text for chunk in chunks for c in chunk.choices) == first.choices[0].text
    assert chunks[-1].usage.prompt_tokens == 5 and 1 <= chunks[-1].usage.completion_tokens <= 10
    with pytest.raises(openai.UnprocessableEntityError, match="exceeds the model's context of 256 tokens"):
        client.completions.create(model=Path(checkpoint).name, prompt="hi", max_tokens=1000)
    with pytest.raises(openai.NotFoundError, match="is not served here"):
        client.completions.create(model="gpt-3.5-turbo-instruct", prompt="hi")
    # What evaluation harnesses send to score text (lm-evaluation-harness's local-completions backend).
    scored = client.completions.create(model=Path(checkpoint).name, prompt="The meaning of life is", max_tokens=0,
                                       echo=True, logprobs=1, temperature=0).choices[0]
    assert scored.text == "The meaning of life is" and scored.logprobs.token_logprobs[0] is None
    assert len(scored.logprobs.tokens) == 5 and all(lp < 0 for lp in scored.logprobs.token_logprobs[1:])


def test_client_that_disconnects_mid_stream_frees_its_slot(server):
    tokens_before = metric(server.url, "serve_generated_tokens_total")
    cancelled_before = metric(server.url, "serve_requests_cancelled_total")
    body = {"prompt": "Tell me a long story", "max_new_tokens": 200, "seed": 1, "stream": True}
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=60) as response:
        lines = response.iter_lines()
        while not next(lines).startswith("data: "):
            pass
    # The connection is closed; the engine drops the sequence at its next step.
    deadline = time.monotonic() + 10
    while httpx.get(f"{server.url}/health").json()["batch_size"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert httpx.get(f"{server.url}/health").json()["batch_size"] == 0
    assert metric(server.url, "serve_generated_tokens_total") - tokens_before < 200
    assert metric(server.url, "serve_requests_cancelled_total") == cancelled_before + 1


# How long a wait may take before the test calls it a hang: a bound no busy host comes near (at load 14 on 2 cores a
# process gets a seventh of a core), never what a test asserts; what a wait shows is its condition, reached.
HANG_S = 120


def wait_until(condition, timeout_s: float = HANG_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def raw_request(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def test_client_that_disconnects_while_waiting_frees_its_rows(server, checkpoint):
    """Non-streaming: the rows leave the batch as soon as the socket closes, and the request is logged 499."""
    rows, max_tokens = 8, 250  # about a second of decoding: ample time to close the socket in the middle
    tokens_before = metric(server.url, "serve_generated_tokens_total")
    cancelled_before = metric(server.url, "serve_requests_cancelled_total")
    body = json.dumps({"model": Path(checkpoint).name, "prompt": "Tell me a long story", "max_tokens": max_tokens,
                       "n": rows, "temperature": 0}).encode()
    with socket.create_connection((LOOPBACK, server.port)) as client:
        client.sendall(raw_request("/v1/completions", body))
        assert wait_until(lambda: httpx.get(f"{server.url}/health").json()["batch_size"] == rows)
    # The rows left early, however long the host took: fewer tokens than the request asked for were made.
    assert wait_until(lambda: httpx.get(f"{server.url}/health").json()["batch_size"] == 0)
    assert metric(server.url, "serve_generated_tokens_total") - tokens_before < rows * max_tokens
    assert wait_until(lambda: "POST /v1/completions 499" in server.log())
    assert metric(server.url, "serve_requests_cancelled_total") == cancelled_before + 1  # one request, 8 rows


# Values each field must refuse (a wrong model name is a 404, also a 4xx).
BAD_VALUES = {
    "/generate": {
        "prompt": [None, True, -1, "", [], {}, ["hi"]], "max_new_tokens": [None, True, -1, 0, 10**40, 1.5, "4", 1000],
        "temperature": [None, True, -1, -1e308, 1e308, "x", []], "top_k": [True, -1, 0, 1.5, 10**40, "5"],
        "top_p": [True, -1, 0, 1.5, "x", {}], "seed": [True, -1, 1.5, 10**40, "1"],
        "stop": [True, 1, "", [""], ["a"] * 5, [1], {}, "x" * 200], "stream": [None, 1, "yes", []],
        "logprobs": [True, -1, 6, 1.5, "5", []],
    },
    "/v1/completions": {
        "model": [None, 1, [], "x"], "prompt": [None, 1, "", [], [-1], [50257], [[]], [1.5], [[1], "x"], [""], {"a": 1}],
        "max_tokens": [0, -1, True, 10**40, 1000, None], "n": [0, -1, 100, True, 1.5], "temperature": [-1, 3, "x", True],
        "top_p": [0, 2, None, "x"], "stream": [None, "yes", 1], "echo": ["x", 2], "logprobs": [6, -1, "x"],
        "stop": ["", [""], 1, ["a"] * 5], "seed": [-1, 2**64, "x"], "suffix": ["tail", 1],
    },
}


def random_bad_body(rng: random.Random, model_id: str) -> tuple[str, bytes]:
    """A body for /generate or /v1/completions that is wrong in one random way."""
    path = rng.choice(list(BAD_VALUES))
    good = {"prompt": "hi", "max_new_tokens": 4} if path == "/generate" else {"model": model_id, "prompt": "hi"}
    kind = rng.randrange(6)
    if kind == 0:  # a known field with a wrong value
        key = rng.choice(list(BAD_VALUES[path]))
        return path, json.dumps({**good, key: rng.choice(BAD_VALUES[path][key])}).encode()
    if kind == 1:  # an unknown field
        return path, json.dumps({**good, f"field{rng.randrange(100)}": rng.randrange(10)}).encode()
    if kind == 2:  # truncated JSON
        text = json.dumps(good)
        return path, text[: rng.randrange(1, len(text))].encode()
    if kind == 3:  # random bytes
        return path, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    if kind == 4:  # deep nesting
        depth = rng.randrange(100, 3000)
        return path, b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"
    return path, json.dumps(rng.choice([None, 1, "x", [], [good]])).encode()  # not an object


def test_random_bad_bodies_get_4xx_and_the_server_lives(server, checkpoint):
    rng = random.Random(0)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for _ in range(300):
            path, content = random_bad_body(rng, Path(checkpoint).name)
            response = client.post(path, content=content, headers={"content-type": "application/json"})
            assert 400 <= response.status_code < 500, (path, content[:200], response.text)
            assert "message" in response.json()["error"]
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    assert generate(server.url, {"prompt": "still alive", "max_new_tokens": 3})["tokens"] >= 1


def test_load_test_reports_every_level(server):
    results = asyncio.run(run_levels(server.url, [1, 4], min_requests=4, max_new_tokens=6, time_limit_s=60,
                                     request_timeout_s=60))
    assert [(r.concurrency, len(r.ok), r.errors, r.overloaded) for r in results] == [(1, 4, 0, 0), (4, 4, 0, 0)]
    assert all(o.ttft_s is not None and o.ttft_s <= o.latency_s for r in results for o in r.ok)
    table = format_table(results)
    assert table.count("\n") == 3 and "| 4 | 4 | 4 | 0 | 0 |" in table


def test_load_test_reads_openai_completion_streams(server, checkpoint):
    """The llama-server comparison's requests (bench/experiments/serve_speed.py): streamed /v1/completions with
    token-id prompts, each exactly its max_tokens long, counted from the stream's usage event."""
    body = lambda i, new: completion_body(Path(checkpoint).name, [464, 995 + i, 318], new)
    level = checked(asyncio.run(run_level(server.url, 3, 3, 5, 60, 60, body=body, route="/v1/completions")), 5)
    assert all(o.tokens == 5 and 0 < o.ttft_s <= o.latency_s for o in level.outcomes)
    wrong = asyncio.run(run_level(server.url, 1, 1, 5, 60, 60, route="/v1/completions",
                                  body=lambda i, new: completion_body("no-such-model", [464], new)))
    assert wrong.outcomes[0].status == 404 and "no-such-model" in wrong.outcomes[0].error


def read_until_closed(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    return data


def test_slow_senders_are_cut_off_while_health_keeps_answering(server):
    """Clients that trickle their headers or body get 408 at the deadline, a silent one is closed, and
    /health answers all along: before the deadline frees any of their connections, not behind them.  Events, not
    durations, so that a busy host, which slows every answer, does not fail it."""
    started = time.monotonic()
    connect = lambda: socket.create_connection((LOOPBACK, server.port), timeout=5)
    header_tricklers = [connect() for _ in range(4)]
    for s in header_tricklers:
        s.sendall(b"POST /generate HTTP/1.1\r\nhost: test\r\n")
    body_trickler = connect()
    body_trickler.sendall(raw_request("/generate", b" " * 100)[:-99])  # headers and the first byte of 100
    silent = connect()
    trickling, replies, answered_while_held = [*header_tricklers, body_trickler], {}, 0
    # One client for every /health: httpx.get builds an SSL context a call, CPU a busy host is short of.
    with httpx.Client(timeout=HANG_S) as client:
        try:
            while trickling and time.monotonic() - started < READ_TIMEOUT_S + HANG_S:
                for s in list(trickling):
                    if select.select([s], [], [], 0)[0]:  # answered: stop sending, so the reply is not reset
                        trickling.remove(s)
                        replies[s] = read_until_closed(s)
                    else:
                        s.sendall(b"x" if s in header_tricklers else b" ")
                held = not replies  # every slow sender still connected as this /health goes out
                assert client.get(f"{server.url}/health").status_code == 200
                if held and not select.select([*trickling, silent], [], [], 0)[0]:  # and still as its answer came
                    answered_while_held += 1
                time.sleep(0.2)
            assert not trickling, f"{len(trickling)} slow senders still connected after {READ_TIMEOUT_S + HANG_S}s"
            assert time.monotonic() - started >= READ_TIMEOUT_S
            for reply in replies.values():
                assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive within" in reply, reply
            assert read_until_closed(silent) == b""  # closed without a reply: it never started a request
            assert answered_while_held >= 1  # /health did not wait behind the slow senders until their deadline
        finally:
            for s in [*header_tricklers, body_trickler, silent]:
                s.close()
    # The header tricklers and the silent one are closed by the server; the body's 408 is an answered request.
    assert metric(server.url, 'serve_connections_closed_total{reason="read_timeout"}') >= 5
    assert metric(server.url, 'serve_requests_total{path="/generate",status="408"}') == 1


def test_connections_over_the_cap_get_503_at_once(server):
    held = [socket.create_connection((LOOPBACK, server.port)) for _ in range(MAX_CONNECTIONS)]
    try:
        response = httpx.get(f"{server.url}/health", timeout=5)
    finally:
        for s in held:
            s.close()
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert f"{MAX_CONNECTIONS} connections are open" in response.json()["error"]["message"]
    assert wait_until(lambda: httpx.get(f"{server.url}/health").status_code == 200)
    assert metric(server.url, 'serve_connections_closed_total{reason="over_limit"}') >= 1


SMALL_SERVER = ["--device", "cpu", "--threads", "1", "--max-batch-size", "1", "--max-queue", "1", "--retry-after-s", "2"]


@pytest.fixture(scope="module")
def small_server(checkpoint, tmp_path_factory):
    """One batch row and one queue place: the third concurrent request finds the server full."""
    log = tmp_path_factory.mktemp("serve_small_log") / "server.log"
    with running_server(checkpoint, log, SMALL_SERVER) as server:
        yield server


@pytest.fixture
def stopped_server(checkpoint, tmp_path):
    """A small server of this test's own, which it stops: the module's shared one must outlive it, whatever order
    the tests run in."""
    with running_server(checkpoint, tmp_path / "server.log", SMALL_SERVER) as server:
        yield server


def test_full_queue_answers_503_with_retry_after(small_server):
    body = {"prompt": "hi", "max_new_tokens": 200, "temperature": 0}
    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(lambda _: httpx.post(f"{small_server.url}/generate", json=body, timeout=60),
                                  range(6)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) >= 2 and statuses.count(503) >= 1 and set(statuses) <= {200, 503}
    for r in responses:
        if r.status_code == 503:
            assert r.headers["retry-after"] == "2" and "server busy" in r.json()["error"]["message"]


def test_shutdown_lets_the_request_in_flight_finish(stopped_server):
    result = {}
    body = {"prompt": "hi", "max_new_tokens": 200, "temperature": 0}
    request = threading.Thread(target=lambda: result.update(
        response=httpx.post(f"{stopped_server.url}/generate", json=body, timeout=60)))
    request.start()
    deadline = time.monotonic() + 20
    while httpx.get(f"{stopped_server.url}/health").json()["batch_size"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    stopped_server.stop()  # SIGTERM, then wait for the process to exit
    assert stopped_server.process.poll() is not None
    request.join(30)
    response = result["response"]
    assert response.status_code == 200 and response.json()["tokens"] == 200
    assert "Application shutdown complete" in stopped_server.log()


def stream_data(url: str, body: dict, first_data: threading.Event | None = None) -> list[dict]:
    """The data of a streamed reply's events, in order; `first_data` is set when the first arrives."""
    data = []
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                data.append(json.loads(line.removeprefix("data: ")))
                if first_data is not None:
                    first_data.set()
    return data


def test_requests_past_the_shutdown_deadline_get_a_json_503(tmp_path):
    """At --graceful-shutdown-s uvicorn cancels what still runs or waits; those requests are answered 503 in
    the JSON error shape (uvicorn's own answer is a plain-text 500), and a stream ends with an error event of
    its own form (it was cut mid-body, with a CancelledError traceback in the log)."""
    # A long context, so that the stream sending tokens is still far from its end at the deadline.
    checkpoint = save_small_artifact(tmp_path / "artifact", block_size=1024)
    body = {"prompt": "hi", "max_new_tokens": 250, "temperature": 0}
    openai_body = {"model": Path(checkpoint).name, "prompt": "hi", "max_tokens": 250, "temperature": 0,
                   "stream": True}
    with running_server(checkpoint, tmp_path / "server.log", ["--device", "cpu", "--threads", "1", "--max-batch-size",
                                                              "1", "--max-queue", "6", "--graceful-shutdown-s", "0.2"]) as server:
        with ThreadPoolExecutor(6) as pool:
            streaming = threading.Event()
            long_stream = {**body, "max_new_tokens": 1000, "ignore_eos": True, "stream": True}
            streams = [pool.submit(stream_data, f"{server.url}/generate", long_stream, streaming)]
            assert streaming.wait(HANG_S)  # the first stream is sending tokens; the rest wait behind it
            replies = [pool.submit(httpx.post, f"{server.url}/generate", json=body, timeout=60) for _ in range(4)]
            streams.append(pool.submit(stream_data, f"{server.url}/v1/completions", openai_body))
            assert wait_until(lambda: httpx.get(f"{server.url}/health").json()["queue_depth"] == 5)
            server.stop()
            responses = [reply.result() for reply in replies]
            generate_events, openai_events = [stream.result() for stream in streams]
    assert {r.status_code for r in responses} <= {200, 503} and any(r.status_code == 503 for r in responses)
    for r in responses:
        if r.status_code == 503:
            assert "shut down before this request finished" in r.json()["error"]["message"]
            assert r.headers["retry-after"] == "1"
    assert len(generate_events) > 1 and all("token" in data for data in generate_events[:-1])
    assert generate_events[-1]["error"]["code"] == openai_events[-1]["error"]["code"] == "shutting_down"
    assert "Traceback" not in server.log() and "CancelledError" not in server.log()
