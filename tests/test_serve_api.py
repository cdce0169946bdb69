"""The HTTP layer in-process (FastAPI's test client): replies, validation that names the field, errors."""
from __future__ import annotations

import json
import logging
import re
import threading
from importlib.resources import files
from pathlib import Path

import openai
import pytest
import torch
from fastapi.testclient import TestClient

from model.config import EOT_TOKEN
from model.gpt import GPT
from runtime.provenance import provenance
from serve.app import create_app
from serve.config import API_KEY_ENV, ServeConfig, ServeConfigError
from serve.schemas import MAX_STOP_STRINGS
from serve.state import ServerState
from tests.conftest import save_small_artifact, small_config

BLOCK_SIZE = 64


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return save_small_artifact(tmp_path_factory.mktemp("serve_api") / "artifact", block_size=BLOCK_SIZE)


def make_client(checkpoint: str, **settings) -> TestClient:
    # One row's step at start-up: these tests start many apps, and the warm-up of every row count is
    # test_serve_engine's and the live server's.
    return TestClient(create_app(ServeConfig(checkpoint=checkpoint, device="cpu", **{"warm_up": "one-row", **settings})))


@pytest.fixture(scope="module")
def client(checkpoint):
    with make_client(checkpoint, max_body_bytes=4096) as client:
        yield client


def sse_events(response) -> list[tuple[str, dict]]:
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, json.loads(line.removeprefix("data: "))))
    return events


def test_health_names_the_model(client, checkpoint):
    body = client.get("/health").json()
    assert body["model_loaded"] is True and body["artifact"] == "float"
    assert body["device"] == "cpu" and body["checkpoint"] == checkpoint and body["context"] == BLOCK_SIZE
    assert body["vocab_size"] == small_config().vocab_size and body["api_key_required"] is False


def test_generate_replies_with_text_and_latency(client):
    response = client.post("/generate", json={"prompt": "Hello", "max_new_tokens": 8, "seed": 3, "temperature": 0.8})
    assert response.status_code == 200
    body = response.json()
    assert body["finish_reason"] in ("length", "eos") and 1 <= body["tokens"] <= 8 and body["prompt_tokens"] == 1
    latency = body["latency"]
    assert 0 <= latency["queue_ms"] <= latency["time_to_first_token_ms"] <= latency["total_ms"]
    assert latency["tokens_per_s"] > 0
    again = client.post("/generate", json={"prompt": "Hello", "max_new_tokens": 8, "seed": 3, "temperature": 0.8})
    assert again.json()["text"] == body["text"]


def test_stream_sends_each_token_then_the_reply(client):
    request = {"prompt": "Hello", "max_new_tokens": 6, "seed": 3, "temperature": 0.8}
    expected = client.post("/generate", json=request).json()
    with client.stream("POST", "/generate", json={**request, "stream": True}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    names = [name for name, _ in events]
    assert names[-1] == "done" and set(names[:-1]) == {"token"}
    assert "".join(data["text"] for name, data in events if name == "token") == expected["text"]
    done = events[-1][1]
    assert done["text"] == expected["text"] and done["tokens"] == expected["tokens"]
    assert set(done["latency"]) == {"queue_ms", "time_to_first_token_ms", "total_ms", "tokens_per_s"}


def test_generate_logprobs_come_with_each_streamed_token_as_the_openai_endpoint_scores_them(client, checkpoint):
    """The playground's shading: each token event carries the token's log-probability and alternatives, the same
    as the reply's `logprobs` without a stream and as /v1/completions' for the same tokens."""
    request = {"prompt": "Hello there", "max_new_tokens": 6, "temperature": 0, "logprobs": 3, "ignore_eos": True}
    reply = client.post("/generate", json=request).json()
    entries = reply["logprobs"]
    assert len(entries) == reply["tokens"] == 6 and "".join(e["text"] for e in entries) == reply["text"]
    for entry in entries:  # greedy: the chosen token is the most likely
        assert len(entry["top_logprobs"]) == 3 and entry["top_logprobs"][0]["token"] == entry["token"]
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"] < 0
    with client.stream("POST", "/generate", json={**request, "stream": True}) as response:
        events = sse_events(response)
    assert [{k: d[k] for k in ("token", "logprob", "top_logprobs")} for name, d in events if name == "token"] == \
        [{k: e[k] for k in ("token", "logprob", "top_logprobs")} for e in entries]
    assert events[-1][1]["logprobs"] is None  # the token events carried them
    openai = client.post("/v1/completions", json={"model": Path(checkpoint).name, "prompt": "Hello there",
                                                  "max_tokens": 6, "temperature": 0, "logprobs": 3,
                                                  "ignore_eos": True}).json()["choices"][0]["logprobs"]
    assert openai["tokens"] == [e["text"] for e in entries]
    assert openai["token_logprobs"] == pytest.approx([e["logprob"] for e in entries])
    assert openai["top_logprobs"] == [{a["text"]: pytest.approx(a["logprob"]) for a in e["top_logprobs"]}
                                      for e in entries]
    assert client.post("/generate", json={"prompt": "hi", "max_new_tokens": 2}).json()["logprobs"] is None


def test_stop_string_ends_the_text_before_it(client):
    greedy = {"prompt": "The", "max_new_tokens": 12, "temperature": 0}
    full = client.post("/generate", json=greedy).json()["text"]
    stop = full[len(full) // 2:len(full) // 2 + 3]
    body = client.post("/generate", json={**greedy, "stop": [stop]}).json()
    assert body["finish_reason"] == "stop" and body["text"] == full[:full.index(stop)]


@pytest.mark.parametrize("body, param, message", [
    ({}, "prompt", "prompt is required"),
    ({"prompt": ""}, "prompt", "at least 1 character"),
    ({"prompt": 5}, "prompt", "valid string"),
    ({"prompt": "hi", "max_new_tokens": 0}, "max_new_tokens", "greater than or equal to 1"),
    ({"prompt": "hi", "max_new_tokens": "5"}, "max_new_tokens", "valid integer"),
    ({"prompt": "hi", "max_new_tokens": 10**30}, "max_new_tokens", "exceeds the model's context"),
    ({"prompt": "hi", "temperature": -1}, "temperature", "greater than or equal to 0"),
    ({"prompt": "hi", "temperature": 1e300}, "temperature", "less than or equal to 10"),
    ({"prompt": "hi", "top_p": 0}, "top_p", "greater than 0"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p", "less than or equal to 1"),
    ({"prompt": "hi", "top_k": 0}, "top_k", "greater than or equal to 1"),
    ({"prompt": "hi", "top_k": 10**6, "max_new_tokens": 4}, "top_k", "exceeds the vocabulary of 50257"),
    ({"prompt": "hi", "seed": -1}, "seed", "greater than or equal to 0"),
    ({"prompt": "hi", "seed": 2**70}, "seed", "less than or equal to"),
    ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"prompt": "hi", "stop": [""]}, "stop[0]", "at least 1 character"),
    ({"prompt": "hi", "stream": "yes"}, "stream", "valid boolean"),
    ({"prompt": "hi", "bogus": 1}, "bogus", "unknown field 'bogus'; the accepted fields are prompt, max_new_tokens"),
    ({"prompt": "hi", "max_new_tokens": 64}, "max_new_tokens",
     "prompt is 1 token(s) and max_new_tokens is 64: 65 exceeds the model's context of 64 tokens"),
    ({"prompt": "word " * 70, "max_new_tokens": 1}, "prompt", "exceeds the model's context of 64 tokens"),
])
def test_bad_fields_are_named(client, body, param, message):
    response = client.post("/generate", json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"], error


@pytest.mark.parametrize("content, status, message", [
    (b'{"prompt": "hi",', 400, "not valid JSON"),
    (b"[1, 2]", 422, "request body: Input should be a valid dictionary"),
    (b'{"prompt": "hi", "temperature": NaN}', 422, "temperature"),
    (b'{"prompt": "\xc3\x28"}', 400, "could not be read as JSON"),
    (b'{"prompt": "' + b"x" * 5000 + b'"}', 413, "larger than the limit of 4096 bytes"),
])
def test_malformed_bodies_get_4xx_with_a_message(client, content, status, message):
    response = client.post("/generate", content=content, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]


def test_streamed_body_over_the_limit_is_refused(client):
    chunks = iter([b'{"prompt": "', b"x" * 3000, b"y" * 3000, b'"}'])  # no Content-Length: sent chunked
    response = client.post("/generate", content=chunks, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["message"] == "request body is larger than the limit of 4096 bytes"


def test_unknown_paths_and_methods_answer_json(client):
    assert client.get("/nope").json()["error"]["message"].startswith("no endpoint at /nope")
    assert client.get("/generate").status_code == 405


@pytest.mark.parametrize("page, assets", [
    ("/docs", ["/docs-assets/swagger-ui.css", "/docs-assets/favicon.png", "/docs-assets/swagger-ui-bundle.js"]),
    ("/redoc", ["/docs-assets/favicon.png", "/docs-assets/redoc.standalone.js"]),
])
def test_the_docs_pages_load_their_files_from_this_server(client, page, assets):
    """Issue 42: /docs, which the 404 at / points to, must work offline: every file it loads is served here."""
    html = client.get(page).text
    assert re.findall(r'(?:src|href)="([^"]+)"', html) == assets and "http" not in html
    static = Path(files("fastapi_offline") / "static")
    for url in assets:
        response = client.get(url)
        assert response.status_code == 200
        assert response.content == (static / url.removeprefix("/docs-assets/")).read_bytes()
    assert client.get("/docs-assets/nope.js").status_code == 404


def test_openai_request_checks(client, checkpoint):
    base = {"model": Path(checkpoint).name, "prompt": "hi", "max_tokens": 4}
    for body, status, param in [({**base, "model": "gpt-4"}, 404, "model"), ({**base, "n": 9}, 422, "n"),
                                ({**base, "presence_penalty": 2.5}, 422, "presence_penalty"),
                                ({**base, "prompt": ["ok", "word " * 70]}, 422, "prompt[1]"),
                                ({**base, "prompt": [[1, 2], [3, 50257]]}, 422, "prompt[1][1]"),
                                ({**base, "prompt": [5, -1]}, 422, "prompt[1]"),
                                ({**base, "prompt": [[1], [2] * 70]}, 422, "prompt[1]"),
                                ({**base, "prompt": [1.5]}, 422, "prompt"),
                                ({**base, "temperature": 3}, 422, "temperature")]:
        response = client.post("/v1/completions", json=body)
        assert response.status_code == status, body
        assert response.json()["error"]["param"] == param
    # A rule across fields names its own fix, not the hint for a body that is not a JSON object.
    response = client.post("/v1/completions", json={**base, "max_tokens": 0})
    assert response.status_code == 422
    assert response.json()["error"]["message"] == ("max_tokens: 0 generates nothing; it is allowed only with echo "
                                                    "(to score the prompt)")
    # Two prompts x n=2: choices run prompt-major, the prompt tokens count once per prompt.
    reply = client.post("/v1/completions", json={**base, "prompt": ["hi", "hello there"], "n": 2, "seed": 1}).json()
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2, 3]
    assert reply["usage"]["prompt_tokens"] == 1 + 2
    assert 4 <= reply["usage"]["completion_tokens"] <= 16


def test_metrics_count_requests_by_status(client):
    client.post("/generate", json={"prompt": ""})
    client.get("/some/random/path")
    text = client.get("/metrics").text
    assert 'serve_requests_total{path="/generate",status="422"}' in text
    assert 'serve_requests_total{path="other",status="404"}' in text
    assert "/some/random/path" not in text
    for name in ("serve_queue_seconds", "serve_time_to_first_token_seconds", "serve_request_seconds"):
        assert f"# TYPE {name} histogram" in text
    assert "serve_queue_depth 0" in text and "serve_batch_size" in text and "serve_generated_tokens_total" in text


def test_api_key_is_required_when_set(checkpoint, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "s3cret")
    with make_client(checkpoint) as client:
        request = {"prompt": "hi", "max_new_tokens": 2}
        assert client.post("/generate", json=request).status_code == 401
        assert client.post("/generate", json=request, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.post("/generate", json=request, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.post("/generate", json=request, headers={"Authorization": "bearer s3cret"}).status_code == 200
        assert client.post("/generate", json=request, headers={"X-API-Key": "s3cret"}).status_code == 200
        assert client.get("/v1/models").status_code == 401
        assert client.get("/metrics").status_code == 401  # its prefix-cache counters tell of other clients' prompts
        assert client.get("/metrics", headers={"X-API-Key": "s3cret"}).status_code == 200
        assert client.get("/health").status_code == 200


def test_any_of_several_api_keys_is_accepted(checkpoint, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "key-one,key-two")
    with make_client(checkpoint) as client:
        request = {"prompt": "hi", "max_new_tokens": 1}
        for key, status in (("key-one", 200), ("key-two", 200), ("key-one,key-two", 401), ("key", 401)):
            assert client.post("/generate", json=request, headers={"X-API-Key": key}).status_code == status


def test_time_limit_answers_504_and_ends_a_stream_with_an_error(checkpoint):
    with make_client(checkpoint, request_timeout_s=1e-6) as client:
        response = client.post("/generate", json={"prompt": "hi", "max_new_tokens": 4})
        assert response.status_code == 504
        assert "exceeded the time limit" in response.json()["error"]["message"]
        with client.stream("POST", "/generate", json={"prompt": "hi", "max_new_tokens": 4, "stream": True}) as r:
            events = sse_events(r)
        assert events[-1][0] == "error" and "time limit" in events[-1][1]["error"]["message"]


@pytest.mark.parametrize("quantize_head", [False, True])
def test_int8_artifact_is_served(tmp_path, quantize_head):
    from model.int8 import quantize_model
    from storage.artifact import int8_artifact_writers, write_folder_atomically
    torch.manual_seed(0)
    model = GPT(small_config(block_size=BLOCK_SIZE))
    quantization = quantize_model(model, head="int8" if quantize_head else "fp32")
    write_folder_atomically(tmp_path, int8_artifact_writers(model, provenance("tests"), quantization))
    with make_client(str(tmp_path)) as client:
        assert client.get("/health").json()["artifact"] == "int8"
        request = {"prompt": "Hello", "max_new_tokens": 5, "temperature": 0}
        alone = client.post("/generate", json=request).json()
        assert alone["tokens"] >= 1 and alone["finish_reason"] in ("length", "eos")


def test_served_model_name_and_health_without_the_path(checkpoint, monkeypatch):
    with make_client(checkpoint, served_model_name="demo-gpt2") as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["demo-gpt2"]
        reply = client.post("/v1/completions", json={"model": "demo-gpt2", "prompt": "hi", "max_tokens": 2})
        assert reply.status_code == 200 and reply.json()["model"] == "demo-gpt2"
        assert client.post("/v1/completions", json={"model": checkpoint, "prompt": "hi"}).status_code == 404
    monkeypatch.setenv("GPT2_SERVE_API_KEY", "secret")
    with make_client(checkpoint) as client:  # /health is open: with a key set it names the folder, not its path
        assert client.get("/health").json()["checkpoint"] == Path(checkpoint).name


def test_logprobs_and_echo_score_text_as_evaluation_does(client, checkpoint):
    """echo + max_tokens 0 returns the prompt's own log-probabilities; their sum is minus the summed
    cross-entropy that training/evaluate.py computes on the same text."""
    from data.tokenizer import encode
    from training.evaluate import evaluate_loss
    from storage.artifact import load_model
    text = "The quick brown fox jumps over the lazy dog."
    name = Path(checkpoint).name
    reply = client.post("/v1/completions", json={"model": name, "prompt": text, "max_tokens": 0, "echo": True,
                                                 "logprobs": 2})
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    lp = choice["logprobs"]
    ids = encode(text)
    assert choice["text"] == text and "".join(lp["tokens"]) == text and len(lp["tokens"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(ids))]
    assert all(len(top) <= 2 and max(top.values()) >= chosen - 1e-6
               for top, chosen in zip(lp["top_logprobs"][1:], lp["token_logprobs"][1:]))
    model, _ = load_model(checkpoint)
    x, y = torch.tensor([ids[:-1]]), torch.tensor([ids[1:]])
    expected = evaluate_loss(model, [(x, y)], "cpu")["val_loss"] * (len(ids) - 1)
    assert sum(lp["token_logprobs"][1:]) == pytest.approx(-expected, rel=1e-4)

    greedy = client.post("/v1/completions", json={"model": name, "prompt": text, "max_tokens": 3, "temperature": 0,
                                                  "logprobs": 1}).json()["choices"][0]
    entries = greedy["logprobs"]
    assert "".join(entries["tokens"]) == greedy["text"]
    for top, chosen, token in zip(entries["top_logprobs"], entries["token_logprobs"], entries["tokens"]):
        assert list(top) == [token] and top[token] == pytest.approx(chosen)  # greedy: the chosen token is the best


@pytest.mark.parametrize("extra, param", [({"max_tokens": 0}, "max_tokens"), ({"logprobs": 6}, "logprobs")])
def test_scoring_requests_that_cannot_work_are_refused(client, checkpoint, extra, param):
    reply = client.post("/v1/completions", json={"model": Path(checkpoint).name, "prompt": "hi", **extra})
    assert reply.status_code == 422 and param in reply.json()["error"]["message"]


def test_an_unexpected_error_answers_500_without_its_text(checkpoint, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("secret internal detail")

    app = create_app(ServeConfig(checkpoint=checkpoint, device="cpu", warm_up="one-row"))
    with TestClient(app, raise_server_exceptions=False) as client:
        monkeypatch.setattr(ServerState, "encode_within_context", broken)  # once started, as a fault in service
        response = client.post("/generate", json={"prompt": "hi", "max_new_tokens": 2})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error" and "server log" in error["message"]
    assert "secret" not in response.text and "RuntimeError" not in response.text


POISON_SEED = 666


def test_a_request_whose_sampling_fails_gets_an_error_without_internal_text(checkpoint, monkeypatch):
    """Plain and streamed: the failing request gets OpenAI's error shape, the server stays up."""
    from decode.sampling import sample_rows_on_device

    def poisoned(logits, params, generators, generated):
        if any(p.seed == POISON_SEED for p in params):
            raise FloatingPointError("secret internal detail")
        return sample_rows_on_device(logits, params, generators, generated)

    monkeypatch.setattr("serve.sampled_step.sample_rows_on_device", poisoned)
    with make_client(checkpoint) as client:
        response = client.post("/generate", json={"prompt": "hi", "max_new_tokens": 4, "seed": POISON_SEED})
        assert response.status_code == 500 and response.json()["error"]["type"] == "server_error"
        body = {"model": Path(checkpoint).name, "prompt": "hi", "max_tokens": 4, "seed": POISON_SEED, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as streamed:
            chunks = [line for line in streamed.iter_lines() if line.startswith("data: ")]
        assert json.loads(chunks[-1].removeprefix("data: "))["error"]["type"] == "server_error"
        for text in (response.text, *chunks):
            assert "secret" not in text and "FloatingPointError" not in text
        assert client.post("/generate", json={"prompt": "hi", "max_new_tokens": 2, "seed": 1}).status_code == 200


@pytest.mark.parametrize("settings", [{"temperature": 7.3e-39}, {"temperature": 5e-324},
                                      {"temperature": 1.0, "top_p": 1e-300}])
def test_vanishing_temperature_or_top_p_decodes_greedily(client, checkpoint, settings):
    """The issue's triggers: a temperature below the floor is greedy, a top_p that rounds to 0 keeps the best token."""
    greedy = client.post("/generate", json={"prompt": "The", "max_new_tokens": 8, "temperature": 0}).json()["text"]
    body = {"prompt": "The", "max_new_tokens": 8, "seed": 1, **settings}
    assert client.post("/generate", json=body).json()["text"] == greedy
    openai_body = {"model": Path(checkpoint).name, "prompt": "The", "max_tokens": 8, "seed": 1, **settings}
    assert client.post("/v1/completions", json=openai_body).json()["choices"][0]["text"] == greedy


def test_ignore_eos_generates_exactly_max_new_tokens(checkpoint, monkeypatch):
    """A model that always says end-of-text: the reply stops at it, unless the request sets ignore_eos."""
    monkeypatch.setattr("serve.sampled_step.sample_rows_on_device",
                        lambda logits, params, *_: torch.full((len(params),), EOT_TOKEN))
    with make_client(checkpoint) as client:
        stopped = client.post("/generate", json={"prompt": "hi", "max_new_tokens": 5}).json()
        assert (stopped["tokens"], stopped["finish_reason"]) == (1, "eos")
        kept = client.post("/generate", json={"prompt": "hi", "max_new_tokens": 5, "ignore_eos": True}).json()
        assert (kept["tokens"], kept["finish_reason"]) == (5, "length")
        completion = {"model": Path(checkpoint).name, "prompt": "hi", "max_tokens": 5}
        stopped = client.post("/v1/completions", json=completion).json()
        assert (stopped["usage"]["completion_tokens"], stopped["choices"][0]["finish_reason"]) == (1, "stop")
        kept = client.post("/v1/completions", json={**completion, "ignore_eos": True}).json()
        assert (kept["usage"]["completion_tokens"], kept["choices"][0]["finish_reason"]) == (5, "length")


def test_a_path_cannot_forge_a_request_log_line(client, caplog):
    caplog.set_level(logging.INFO, logger="serve.requests")
    client.get("/x%0A2026-01-01 12:00:00 INFO serve.requests: 10.0.0.1 POST /generate 200 1.0ms 5B")
    [line] = [r.getMessage() for r in caplog.records if r.name == "serve.requests"]
    assert "\n" not in line and " /x\\x0a2026-01-01\\x2012:00:00" in line and line.endswith("B")
    assert line.split(" ")[3] == "404"  # client, method, path, status: the path is one field


@pytest.mark.parametrize("key", ["clé", "s3cret ", "tab\tkey", "two words", "a,,b", ",a", "a,"])
def test_an_api_key_no_header_can_carry_is_refused_at_startup(checkpoint, monkeypatch, key):
    monkeypatch.setenv(API_KEY_ENV, key)
    with pytest.raises(ServeConfigError, match=f"{API_KEY_ENV} must hold keys of printable ASCII"):
        create_app(ServeConfig(checkpoint=checkpoint, device="cpu"))


def test_more_completions_than_the_server_can_ever_hold_is_a_422_naming_n(checkpoint):
    with make_client(checkpoint, max_batch_size=4, max_queue=2) as client:
        body = {"model": Path(checkpoint).name, "prompt": "hi", "max_tokens": 1}
        reply = client.post("/v1/completions", json={**body, "n": 7})
        assert reply.status_code == 422 and "retry-after" not in reply.headers
        error = reply.json()["error"]
        assert error["param"] == "n" and "holds at most 6 at once (--max-batch-size 4 + --max-queue 2)" in error["message"]
        assert len(client.post("/v1/completions", json={**body, "n": 6}).json()["choices"]) == 6


def test_token_id_prompts_work_as_the_text_they_encode(client, checkpoint):
    """OpenAI's prompt forms: a list of token ids is one prompt, a list of such lists a batch."""
    from data.tokenizer import encode
    text, other = "The quick brown fox", "Hello"
    base = {"model": Path(checkpoint).name, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 1}
    by_text = client.post("/v1/completions", json={**base, "prompt": text}).json()
    by_ids = client.post("/v1/completions", json={**base, "prompt": encode(text)}).json()
    assert by_ids["choices"] == by_text["choices"] and by_ids["usage"] == by_text["usage"]
    batch = client.post("/v1/completions", json={**base, "prompt": [encode(text), encode(other)], "n": 2}).json()
    assert [c["text"] for c in batch["choices"]][:2] == [by_text["choices"][0]["text"]] * 2
    assert batch["choices"][2]["text"].startswith(other) and batch["choices"][2]["logprobs"]["tokens"][0] == other
    assert batch["usage"]["prompt_tokens"] == len(encode(text)) + len(encode(other))


def test_the_harness_loglikelihood_request_scores_the_continuation(client, checkpoint):
    """lm-evaluation-harness 0.4's local-completions: context + continuation as token ids, echo, logprobs 1,
    max_tokens 1, and the continuation's log-likelihood is token_logprobs[len(context):-1]."""
    from data.tokenizer import encode
    context, continuation = encode("The capital of France is"), encode(" Paris, a city")
    body = {"model": Path(checkpoint).name, "prompt": [context + continuation], "echo": True, "logprobs": 1,
            "temperature": 0}
    harness = client.post("/v1/completions", json={**body, "max_tokens": 1}).json()["choices"][0]["logprobs"]
    scored = client.post("/v1/completions", json={**body, "max_tokens": 0}).json()["choices"][0]["logprobs"]
    assert len(harness["token_logprobs"]) == len(context + continuation) + 1
    assert harness["token_logprobs"][len(context):-1] == pytest.approx(scored["token_logprobs"][len(context):])


@pytest.mark.parametrize("max_tokens", [0, 4])
def test_a_stream_with_echo_sends_the_prompt_first(client, checkpoint, max_tokens):
    body = {"model": Path(checkpoint).name, "prompt": ["Hello there", "The"], "n": 2, "max_tokens": max_tokens,
            "echo": True, "temperature": 0}
    expected = [c["text"] for c in client.post("/v1/completions", json=body).json()["choices"]]
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        chunks = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines()
                  if line.startswith("data: {")]
    texts = ["", "", "", ""]
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts == expected and expected[0].startswith("Hello there") and expected[2].startswith("The")
    assert [c["choices"][0]["text"] for c in chunks[:4]] == ["Hello there", "Hello there", "The", "The"]


def assert_offsets_index_the_text(text: str, logprobs: dict) -> None:
    """Every token shown as text is found at its offset; one shown as bytes points into the text."""
    assert logprobs["text_offset"] == sorted(logprobs["text_offset"])
    for token, offset in zip(logprobs["tokens"], logprobs["text_offset"]):
        assert token.startswith("bytes:") and offset < len(text) or text[offset:offset + len(token)] == token


def test_logprobs_of_split_characters_follow_openai(client, checkpoint):
    """Tokens that end inside a character are shown as their bytes, the one that finishes it as the whole
    character; offsets count characters of the returned text."""
    text = "x😀é漢字y"
    body = {"model": Path(checkpoint).name, "prompt": text, "max_tokens": 0, "echo": True, "logprobs": 2}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"] == text
    assert_offsets_index_the_text(text, logprobs)
    assert "".join(t for t in logprobs["tokens"] if not t.startswith("bytes:")) == text
    assert "bytes:\\xf0\\x9f\\x98" in logprobs["tokens"] and "😀" in logprobs["tokens"]
    assert not any("\ufffd" in t for t in logprobs["tokens"])


def test_generated_tokens_offsets_start_after_the_prompt_without_echo(client, checkpoint):
    """As OpenAI's completions do: offsets index prompt + completion, echoed or not."""
    prompt = "Hello"
    body = {"model": Path(checkpoint).name, "prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 0}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["logprobs"]["text_offset"][0] == len(prompt)
    assert_offsets_index_the_text(prompt + choice["text"], choice["logprobs"])


def test_logprobs_leave_out_tokens_cut_by_a_stop_string(client, checkpoint):
    body = {"model": Path(checkpoint).name, "prompt": "Hello", "max_tokens": 4, "temperature": 0, "logprobs": 0}
    first = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]["tokens"][0]
    assert not first.startswith("bytes:")
    choice = client.post("/v1/completions", json={**body, "stop": [first]}).json()["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["logprobs"]["tokens"]) == ("", "stop", [])
    echoed = client.post("/v1/completions", json={**body, "stop": [first], "echo": True}).json()["choices"][0]
    assert echoed["text"] == "Hello" and echoed["logprobs"]["tokens"] == ["Hello"]


def test_logprobs_of_a_token_holding_the_stop_string_show_only_its_part_in_the_text(checkpoint, monkeypatch):
    """Issue 42: the tokens " Paris", '."', " It" with stop '"' return the text " Paris." and the tokens
    [" Paris", "."]: the token that holds the stop string's start is kept, cut to its part in the text, with the
    whole token's log-probability; the token after it is left out, as its text is."""
    generated = iter([6342, 526, 632])  # " Paris", '."', " It"
    with make_client(checkpoint) as client:  # patched once started: the start-up's rehearsal samples too
        monkeypatch.setattr("serve.sampled_step.sample_rows_on_device", lambda logits, params, *_: torch.tensor([next(generated)]))
        body = {"model": Path(checkpoint).name, "prompt": "Hello", "max_tokens": 3, "logprobs": 1, "stop": ['"']}
        choice = client.post("/v1/completions", json=body).json()["choices"][0]
    logprobs = choice["logprobs"]
    assert (choice["text"], choice["finish_reason"]) == (" Paris.", "stop")
    assert logprobs["tokens"] == [" Paris", "."] and "".join(logprobs["tokens"]) == choice["text"]
    assert logprobs["text_offset"] == [5, 11]
    assert len(logprobs["token_logprobs"]) == 2 and all(lp < 0 for lp in logprobs["token_logprobs"])
    assert len(logprobs["top_logprobs"][1]) == 1


def test_a_generated_end_of_text_is_scored(checkpoint, monkeypatch):
    """The harness drops the last entry of an echo + max_tokens 1 reply: it must be the generated token even when
    that token is end-of-text, which the text leaves out."""
    monkeypatch.setattr("serve.sampled_step.sample_rows_on_device",
                        lambda logits, params, *_: torch.full((len(params),), EOT_TOKEN))
    with make_client(checkpoint) as client:
        body = {"model": Path(checkpoint).name, "prompt": "Hello there", "max_tokens": 1, "echo": True, "logprobs": 1}
        choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["text"] == "Hello there" and choice["finish_reason"] == "stop"
    assert choice["logprobs"]["tokens"] == ["Hello", " there", "<|endoftext|>"]
    assert choice["logprobs"]["text_offset"] == [0, 5, 11] and choice["logprobs"]["token_logprobs"][-1] < 0


def test_the_openai_client_is_served_in_every_form_it_sends(client, checkpoint):
    """The official client's requests, each argument form as it serializes it (issue 39: a single stop string
    longer than 4 characters was refused, its length read as a list's item count)."""
    from data.tokenizer import encode
    api = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="unused", http_client=client, max_retries=0)
    greedy = dict(model=Path(checkpoint).name, max_tokens=12, temperature=0)
    full = api.completions.create(prompt="The", **greedy).choices[0].text
    stop = full[len(full) // 2:][:MAX_STOP_STRINGS + 2]
    assert len(stop) > MAX_STOP_STRINGS
    for stop_form in (stop, [stop, "never generated"]):
        cut = api.completions.create(prompt="The", stop=stop_form, **greedy).choices[0]
        assert cut.finish_reason == "stop" and cut.text == full[:full.index(stop)]
    assert api.completions.create(prompt=encode("The"), **greedy).choices[0].text == full
    batch = api.completions.create(prompt=[encode("The"), encode("The")], n=2, best_of=2, **greedy)
    assert [c.text for c in batch.choices] == [full] * 4 and batch.usage.prompt_tokens == 2
    scored = api.completions.create(prompt="The", echo=True, logprobs=2, **greedy).choices[0]
    assert scored.text == "The" + full and len(scored.logprobs.tokens) == len(scored.logprobs.top_logprobs)
    assert all(len(top) == 2 for top in scored.logprobs.top_logprobs[1:])
    chunks = list(api.completions.create(prompt="The", stream=True, stream_options={"include_usage": True},
                                         **greedy))
    assert "".join(c.text for chunk in chunks for c in chunk.choices) == full
    assert chunks[-1].usage.prompt_tokens == 1 and chunks[-1].usage.completion_tokens >= 1


def test_generate_takes_one_stop_string_bounded_by_its_length(client):
    greedy = {"prompt": "The", "max_new_tokens": 12, "temperature": 0}
    full = client.post("/generate", json=greedy).json()["text"]
    stop = full[len(full) // 2:][:MAX_STOP_STRINGS + 2]
    body = client.post("/generate", json={**greedy, "stop": stop}).json()
    assert body["finish_reason"] == "stop" and body["text"] == full[:full.index(stop)]
    refused = client.post("/generate", json={**greedy, "stop": "x" * 101}).json()["error"]
    assert refused["param"] == "stop" and "at most 100 characters" in refused["message"]


def streamed_choices(chunks, count: int) -> list[tuple[str, dict]]:
    """Each choice's text and log-probabilities, joined over the openai client's parsed chunks."""
    texts = [""] * count
    joined = [{"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []} for _ in range(count)]
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.logprobs is not None:
                for key, values in joined[choice.index].items():
                    values.extend(getattr(choice.logprobs, key))
    return list(zip(texts, joined))


@pytest.mark.parametrize("settings", [
    dict(prompt="The", max_tokens=12, logprobs=2),
    dict(prompt=["The", "Hello there"], n=2, max_tokens=8, logprobs=1, echo=True),
    dict(prompt="x😀é漢字y", max_tokens=0, logprobs=2, echo=True),
    dict(prompt="Hello", max_tokens=10, logprobs=0, stop=[" the", "."])])
def test_the_openai_client_streams_logprobs_as_the_reply_lists_them(client, checkpoint, settings):
    """Issue 51: a streamed completion's chunks carry their tokens' log-probabilities, OpenAI's chunk format read
    by the official client's stream parser; joined, the entries are the non-streamed reply's."""
    api = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="unused", http_client=client, max_retries=0)
    body = dict(model=Path(checkpoint).name, temperature=0, **settings)
    whole = api.completions.create(**body).choices
    streamed = streamed_choices(list(api.completions.create(stream=True, **body)), len(whole))
    for choice, (text, logprobs) in zip(whole, streamed):
        assert text == choice.text
        assert logprobs["tokens"] == choice.logprobs.tokens and logprobs["text_offset"] == choice.logprobs.text_offset
        assert logprobs["token_logprobs"] == pytest.approx(choice.logprobs.token_logprobs)
        assert [sorted(t) if t else t for t in logprobs["top_logprobs"]] == \
            [sorted(t) if t else t for t in choice.logprobs.top_logprobs]
    assert any(logprobs["tokens"] for _, logprobs in streamed)


def test_streamed_logprobs_leave_out_the_tokens_a_stop_string_cuts(checkpoint, monkeypatch):
    """The tokens " Paris", '."', " It" with stop '"': the stream's entries are the reply's, [" Paris", "."]."""
    generated = iter([6342, 526, 632])
    with make_client(checkpoint) as client:  # patched once started: the start-up's rehearsal samples too
        monkeypatch.setattr("serve.sampled_step.sample_rows_on_device", lambda logits, params, *_: torch.tensor([next(generated)]))
        body = {"model": Path(checkpoint).name, "prompt": "Hello", "max_tokens": 3, "logprobs": 1, "stop": ['"'],
                "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as response:
            chunks = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines()
                      if line.startswith("data: {")]
    tokens = [t for c in chunks for choice in c["choices"] if choice["logprobs"] for t in choice["logprobs"]["tokens"]]
    assert tokens == [" Paris", "."]
    assert "".join(choice["text"] for c in chunks for choice in c["choices"]) == " Paris."


def test_tokenize_counts_what_a_completion_is_charged_and_detokenize_gives_the_text_back(client, checkpoint):
    text = "The quick brown fox <|endoftext|> jumps"
    tokens = client.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    completion = client.post("/v1/completions", json={"model": Path(checkpoint).name, "prompt": text, "max_tokens": 1,
                                                      "temperature": 0}).json()
    assert tokens["count"] == completion["usage"]["prompt_tokens"] and tokens["max_model_len"] == BLOCK_SIZE
    assert client.post("/tokenize", json={"prompt": text}).json()["tokens"] == tokens["tokens"]
    assert client.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": text}
    assert "/tokenize" in client.get("/openapi.json").json()["paths"]


def test_tokenize_runs_off_the_event_loop_so_health_answers_while_a_large_body_is_tokenized(client, monkeypatch):
    started, release, held_past_health = threading.Event(), threading.Event(), []

    def slow_encode(text: str) -> list[int]:  # stands for the seconds a body of megabytes takes
        started.set()
        held_past_health.append(release.wait(timeout=120))  # False only if /health waited for this to give up
        return [0]

    monkeypatch.setattr("serve.routes_tokens.encode", slow_encode)
    tokenizing = threading.Thread(target=lambda: client.post("/tokenize", json={"prompt": "x"}))
    tokenizing.start()
    assert started.wait(timeout=120)
    assert client.get("/health").status_code == 200  # answered while the tokenizer is still held
    release.set()
    tokenizing.join()
    assert held_past_health == [True]


@pytest.mark.parametrize("block_size", [1, 2, 7])
def test_a_model_with_a_context_shorter_than_the_warm_up_prompt_is_served(tmp_path, block_size, caplog):
    checkpoint = save_small_artifact(tmp_path / "artifact", block_size=block_size)
    with caplog.at_level(logging.WARNING), make_client(checkpoint, warm_up="all-rows") as short:
        assert short.get("/health").json()["context"] == block_size
        reply = short.post("/generate", json={"prompt": "Hello", "max_new_tokens": max(1, block_size - 1)})
        assert reply.status_code == (200 if block_size > 1 else 422), reply.text
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ([] if block_size > 1 else [
        "the model's context of 1 token holds a prompt and no new token: every request to generate will be refused "
        "(422); serve a model with a longer context"])


def test_logit_bias_and_penalties_change_sampling_in_both_doors(client, checkpoint):
    """Issue 51.4: a +100 bias forces its token, strong penalties keep greedy decoding from repeating a token; the
    same fields in /generate and /v1/completions (decode/request_sampling.py maps both)."""
    the = 262
    forced = client.post("/generate", json={"prompt": "Hello", "max_new_tokens": 5, "temperature": 0.8, "seed": 1,
                                            "logit_bias": {str(the): 100}}).json()
    assert forced["text"] == " the" * 5
    body = {"model": Path(checkpoint).name, "prompt": "Hello", "max_tokens": 5, "logit_bias": {str(the): 100}}
    assert client.post("/v1/completions", json=body).json()["choices"][0]["text"] == " the" * 5
    greedy = {"prompt": "Hello", "max_new_tokens": 20, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    plain = [t["token"] for t in client.post("/generate", json=greedy).json()["logprobs"]]
    penalised = [t["token"] for t in client.post("/generate", json={**greedy, "frequency_penalty": 2,
                                                                   "presence_penalty": 2}).json()["logprobs"]]
    assert len(set(plain)) < len(plain) and len(set(penalised)) == len(penalised)
    completion = client.post("/v1/completions", json={"model": Path(checkpoint).name, "prompt": "Hello",
                                                      "max_tokens": 20, "temperature": 0, "ignore_eos": True,
                                                      "frequency_penalty": 2, "presence_penalty": 2}).json()
    assert completion["choices"][0]["text"] == client.post("/generate", json={
        **greedy, "frequency_penalty": 2, "presence_penalty": 2}).json()["text"]


@pytest.mark.parametrize("extra, param, message", [
    ({"logit_bias": {"abc": 1}}, "logit_bias", "key 'abc' is not a token id"),
    ({"logit_bias": {"50257": 1}}, "logit_bias", "token id 50257 is outside the vocabulary"),
    ({"logit_bias": {"7": 100.5}}, "logit_bias", "less than or equal to 100"),
    ({"logit_bias": {"7": "1"}}, "logit_bias", "valid number"),
    ({"logit_bias": [1]}, "logit_bias", "valid dictionary"),
    ({"presence_penalty": 2.5}, "presence_penalty", "less than or equal to 2"),
    ({"frequency_penalty": -3}, "frequency_penalty", "greater than or equal to -2"),
])
def test_bad_bias_and_penalties_are_422s_naming_the_field(client, checkpoint, extra, param, message):
    for path, body in [("/generate", {"prompt": "Hello", "max_new_tokens": 2}),
                       ("/v1/completions", {"model": Path(checkpoint).name, "prompt": "Hello", "max_tokens": 2})]:
        error = client.post(path, json={**body, **extra}).json()["error"]
        assert error["param"] == param and message in error["message"], (path, error)


def test_start_up_rehearses_each_door_and_a_route_failing_then_is_one_warning(checkpoint, monkeypatch, caplog):
    """The rehearsal's requests go through the app (both doors, streamed and whole), are logged under their own client
    name and leave the metrics at zero; a route that fails during it is a warning naming it, not a failed start-up."""
    import logging
    import serve.rehearsal
    caplog.set_level(logging.INFO)
    with make_client(checkpoint) as client:
        metrics = client.get("/metrics").text
    assert 'serve_requests_total{path="/generate"' not in metrics and "serve_generated_tokens_total 0" in metrics
    rehearsed = [r.getMessage() for r in caplog.records if r.getMessage().startswith(serve.rehearsal.CLIENT)]
    assert sorted({line.split()[2] for line in rehearsed}) == ["/generate", "/tokenize", "/v1/completions"]

    def broken(*args, **kwargs):
        raise RuntimeError("broken encoder")
    caplog.clear()
    monkeypatch.setattr(ServerState, "encode_within_context", broken)
    with make_client(checkpoint) as client:
        assert client.get("/health").status_code == 200
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(w.startswith("start-up rehearsal: POST /generate answered 500") for w in warnings), warnings
