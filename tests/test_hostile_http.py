"""The HTTP surface under the hostile-input property (tests/hostile.py), with requests that Schemathesis draws from
the server's own OpenAPI schema (/openapi.json), valid ones and invalid ones, for every endpoint: each reply is a
2xx, or a 4xx whose error body names the field and the fix; never a 5xx, always as the schema documents it, and
the server logs no traceback.

The app is the one `python -m serve` builds, called in-process (the uvicorn-level behaviour -- slow clients,
connection caps, shutdown -- is tests/test_serve_live.py's).  Its model is tiny and its context short, so no
drawn request can generate for long.
"""
from __future__ import annotations

import json
import logging
import math
from typing import Iterator

import pytest
import schemathesis
from hypothesis import given
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.python.asgi import shutdown_lifespans
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_schema_conformance, status_code_conformance,
                                               unsupported_method)

from serve.app import create_app
from serve.config import ServeConfig
from serve.schemas import MAX_DETOKENIZE_TOKENS
from tests.conftest import save_small_artifact
from tests.hostile import check_error_line, examples, record

SURFACE = "http"
MODEL_ID = "tiny"
BLOCK_SIZE = 128
# Every event of the longest stream the context allows is validated (Schemathesis reads 20 by default): the most
# completions per request, each a chunk per token.
MAX_STREAM_EVENTS = 8 * BLOCK_SIZE + 16
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection, unsupported_method]


class ErrorRecords(logging.Handler):
    """Keeps what the server logs at ERROR or with a traceback: the property allows neither."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(record)


@pytest.fixture(scope="module")
def server_errors():
    handler = ErrorRecords()
    logging.getLogger().addHandler(handler)
    yield handler
    logging.getLogger().removeHandler(handler)


@pytest.fixture(scope="module")
def served_schema(tmp_path_factory, server_errors):
    checkpoint = save_small_artifact(tmp_path_factory.mktemp("hostile_http") / "artifact", block_size=BLOCK_SIZE)
    app = create_app(ServeConfig(checkpoint=checkpoint, device="cpu", threads=1, served_model_name=MODEL_ID))
    # A drawn body too large for --max-body-bytes is refused with the documented 413 before its fields are read
    # (a token list one past /detokenize's bound, of drawn large ids, is): that refusal counts as one, beside
    # Schemathesis's own list (its 5xx left out: not_a_server_error fails those).
    rejected = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
    config = schemathesis.Config.from_dict({"max-stream-events": MAX_STREAM_EVENTS,
                                            "checks": {"negative_data_rejection": {"expected-statuses": rejected}}})
    yield schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    shutdown_lifespans()  # stops the engine started with the app's lifespan


def drawn_cases(schema, mode: GenerationMode) -> st.SearchStrategy[tuple]:
    """One case for every operation the schema documents, so that each example reaches every endpoint (an
    operation that takes no input has no invalid form)."""
    operations = [result.ok() for result in schema.get_all_operations()]
    if mode == GenerationMode.NEGATIVE:
        operations = [operation for operation in operations if takes_input(operation)]
    return st.tuples(*(operation.as_strategy(mode) for operation in operations))


def takes_input(operation) -> bool:
    return bool(operation.body) or any(True for _ in operation.iter_parameters())


def serve_the_model(case) -> None:
    """Any model name but this server's is refused at once; a drawn text names it instead, so that valid requests
    generate (a name of the wrong type stays, for the schema's refusal)."""
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = MODEL_ID


def check_error_body(response) -> None:
    """A 4xx's body: the one error shape, with a one-line message; a refused field is named."""
    error = response.json()["error"]
    check_error_line(error["message"], SURFACE)
    if response.status_code == 422:  # the field's name may be "" (a body's key can be)
        assert error["param"] is not None, f"a 422 names the field at fault: {error}"


def check_reply(case, server_errors: ErrorRecords) -> None:
    """The property for one request: a documented 2xx or 4xx (with the error body), no traceback logged."""
    serve_the_model(case)
    response = case.call_and_validate(checks=CHECKS)
    if response.status_code >= 400:
        check_error_body(response)
    assert not server_errors.records, [r.getMessage() for r in server_errors.records]
    record(SURFACE, "worked" if response.status_code < 300 else "refused", f"{case.method} {case.path}")


# The schemathesis pytest plugin's own parametrization (schema.parametrize) cannot load a schema from a fixture
# under pytest 9, so the cases are drawn with Hypothesis directly.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@examples(6)
@given(data=st.data())
def test_drawn_requests_get_documented_replies_and_no_server_error(served_schema, server_errors, mode, data):
    for case in data.draw(drawn_cases(served_schema, mode)):
        check_reply(case, server_errors)


def coverage_cases(schema, per_operation: int) -> Iterator:
    """Schemathesis's coverage cases (each field at its bounds, missing or of another type; methods an operation
    does not take), an even spread of `per_operation` of them for each operation."""
    for result in schema.get_all_operations():
        cases = list(schema.iter_coverage_cases(result.ok(), generation_modes=list(GenerationMode),
                                                generation_config=schema.config.generation))
        yield from cases[::max(1, math.ceil(len(cases) / per_operation))]


def test_boundary_requests_get_documented_replies_and_no_server_error(served_schema, server_errors):
    for case in coverage_cases(served_schema, examples(8).max_examples):
        check_reply(case, server_errors)


# Drawn bodies seldom both stream and fit the context: each route's stream, and the event it must end with.
STREAMS = {
    "/generate": ({"prompt": "Hello", "max_new_tokens": 8, "seed": 1, "stream": True, "logprobs": 5}, "event: done"),
    "/v1/completions": ({"model": MODEL_ID, "prompt": ["Hello", "The"], "n": 2, "max_tokens": 8, "seed": 1,
                         "echo": True, "logprobs": 2, "stream": True, "stream_options": {"include_usage": True}},
                        "data: [DONE]"),
}


@pytest.mark.parametrize("path", STREAMS)
def test_streams_send_the_events_their_schema_documents(served_schema, path):
    body, last_event = STREAMS[path]
    response = served_schema[path]["POST"].Case(body=body, media_type="application/json").call_and_validate(
        checks=CHECKS)
    assert response.headers["content-type"][0].startswith("text/event-stream")
    assert response.text.strip().split("\n\n")[-1].startswith(last_event)


# /tokenize and /detokenize at the edges a client can reach: each refusal is a 422 (or the documented 404) whose one
# line names the field.
TOKEN_CASES = [
    ("/detokenize", {"tokens": [15496, 50257]}, 422, "tokens[1]"),
    ("/detokenize", {"tokens": [-1]}, 422, "tokens[0]"),
    ("/detokenize", {"tokens": [0] * (MAX_DETOKENIZE_TOKENS + 1)}, 422, "tokens"),
    ("/detokenize", {"tokens": "15496"}, 422, "tokens"),
    ("/detokenize", {"tokens": [1.5]}, 422, "tokens[0]"),
    ("/detokenize", {"tokens": [True]}, 422, "tokens[0]"),
    ("/detokenize", {"tokens": [2**70]}, 422, "tokens[0]"),
    ("/detokenize", {}, 422, "tokens"),
    ("/detokenize", {"tokens": [1], "model": "other"}, 404, "model"),
    ("/tokenize", {"prompt": 5}, 422, "prompt"),
    ("/tokenize", {"prompt": ["a"]}, 422, "prompt"),
    ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, 422, "add_special_tokens"),
    ("/tokenize", {"prompt": "a", "extra": 1}, 422, "extra"),
    ("/tokenize", {"prompt": "a", "model": "other"}, 404, "model"),
]


@pytest.mark.parametrize("path, body, status, param", TOKEN_CASES)
def test_token_endpoints_refuse_bad_ids_and_types_with_one_line_naming_the_field(served_schema, server_errors, path,
                                                                                  body, status, param):
    response = served_schema[path]["POST"].Case(body=body, media_type="application/json").call_and_validate(
        checks=CHECKS)
    assert response.status_code == status, response.text
    check_error_body(response)
    assert response.json()["error"]["param"] == param
    assert not server_errors.records, [r.getMessage() for r in server_errors.records]


def test_token_endpoints_answer_in_vllms_shapes(served_schema):
    text = "Hello world, x😀y"
    tokens = served_schema["/tokenize"]["POST"].Case(body={"prompt": text, "return_token_strs": True},
                                                     media_type="application/json").call_and_validate(checks=CHECKS)
    reply = tokens.json()
    assert set(reply) == {"count", "max_model_len", "tokens", "token_strs"}
    assert reply["count"] == len(reply["tokens"]) == len(reply["token_strs"]) and reply["max_model_len"] == BLOCK_SIZE
    back = served_schema["/detokenize"]["POST"].Case(body={"tokens": reply["tokens"], "model": MODEL_ID},
                                                     media_type="application/json").call_and_validate(checks=CHECKS)
    assert back.json() == {"prompt": text}
    empty = served_schema["/tokenize"]["POST"].Case(body={"prompt": ""}, media_type="application/json")
    assert empty.call_and_validate(checks=CHECKS).json() == {"count": 0, "max_model_len": BLOCK_SIZE, "tokens": []}


# Integers past 64 bits reach torch's generator and tensors as C integers: each integer field of each body either
# bounds them (a 422 naming the field) or the route refuses them; a 500 ("Overflow when unpacking long long") is the
# defect issue 54 planted by removing seed's upper bound, which the drawn cases above did not find.
SMALLEST_BODIES = {"/generate": {"prompt": "Hello", "max_new_tokens": 2},
                   "/v1/completions": {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 2}}
HUGE_INTEGERS = (2**63, 2**64, -(2**63) - 1)


def integer_fields(schema, path: str) -> list[str]:
    """The body's fields the route's OpenAPI schema types as integers (alone or in a union)."""
    raw = schema.raw_schema
    body = raw["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    body = raw["components"]["schemas"][body["$ref"].rsplit("/", 1)[-1]] if "$ref" in body else body

    def types(field: dict) -> set[str]:
        return {field.get("type")} | {t for option in field.get("anyOf", []) for t in types(option)}
    return sorted(name for name, field in body["properties"].items() if "integer" in types(field))


@pytest.mark.parametrize("path", SMALLEST_BODIES)
def test_integers_past_64_bits_in_any_field_are_refused_never_a_server_error(served_schema, server_errors, path):
    fields = integer_fields(served_schema, path)
    assert "seed" in fields
    for name in fields:
        for value in HUGE_INTEGERS:
            response = served_schema[path]["POST"].Case(body={**SMALLEST_BODIES[path], name: value},
                                                         media_type="application/json").call_and_validate(
                checks=CHECKS)
            assert 400 <= response.status_code < 500, (name, value, response.status_code, response.text[:300])
            check_error_body(response)
            assert not server_errors.records, [r.getMessage() for r in server_errors.records]


# logit_bias and the penalties on both generating doors: keys that are not ids, ids outside the vocabulary, values
# past OpenAI's bounds or of the wrong type.
DOORS = SMALLEST_BODIES
SAMPLING_CASES = [({"logit_bias": {"1e3": 1}}, "logit_bias"), ({"logit_bias": {"99999999999999999999": 1}}, "logit_bias"),
                  ({"logit_bias": {"1": 1e308}}, "logit_bias"), ({"logit_bias": {"1": None}}, "logit_bias"),
                  ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"), ({"logit_bias": "1"}, "logit_bias"),
                  ({"presence_penalty": True}, "presence_penalty"), ({"frequency_penalty": "0"}, "frequency_penalty"),
                  ({"frequency_penalty": 2.0001}, "frequency_penalty"),
                  # keys past Python's 4,300-digit int(), which once were a 500 and two tracebacks per request
                  ({"logit_bias": {"1" * 4301: 1}}, "logit_bias"), ({"logit_bias": {"9" * 20_000: 1}}, "logit_bias"),
                  ({"logit_bias": {"0" * 4300 + "50257": 1}}, "logit_bias")]


@pytest.mark.parametrize("path", DOORS)
@pytest.mark.parametrize("extra, param", SAMPLING_CASES)
def test_bad_bias_and_penalties_are_one_line_naming_the_field(served_schema, server_errors, path, extra, param):
    response = served_schema[path]["POST"].Case(body={**DOORS[path], **extra},
                                                media_type="application/json").call_and_validate(checks=CHECKS)
    assert response.status_code == 422, response.text
    check_error_body(response)
    assert response.json()["error"]["param"] == param
    assert not server_errors.records, [r.getMessage() for r in server_errors.records]


# Bodies as bytes, which no JSON encoder in Python writes: integers past the interpreter's 4,300 digits in every
# integer field, and nesting past its stack (within --max-body-bytes, so that the body is parsed).  Each is a 4xx naming the problem, never a 500 or a traceback.
def raw_bodies(schema, path: str) -> list[bytes]:
    smallest = json.dumps(SMALLEST_BODIES[path])[:-1]
    return [f'{smallest}, "{name}": {sign}{"9" * 5000}}}'.encode() for name in integer_fields(schema, path)
            for sign in ("", "-")] + [
        f'{smallest}, "logit_bias": {{"1": {"9" * 5000}}}}}'.encode(),
        json.dumps({**SMALLEST_BODIES[path], "prompt": [0]}).replace("[0]", f'[1, {"9" * 5000}]').encode(),
        f'{smallest}, "stop": {"[" * 30_000}{"]" * 30_000}}}'.encode(),
        f'{"[" * 30_000}{"]" * 30_000}'.encode()]


@pytest.mark.parametrize("path", SMALLEST_BODIES)
def test_numbers_and_nesting_past_pythons_parsers_are_refused_never_a_server_error(served_schema, server_errors, path):
    for body in raw_bodies(served_schema, path):
        response = served_schema[path]["POST"].Case(body=body, media_type="application/json").call()
        assert 400 <= response.status_code < 500, (body[:60], response.status_code, response.text[:300])
        check_error_body(response)
        assert not server_errors.records, [r.getMessage() for r in server_errors.records]


def test_token_ids_past_pythons_digits_are_refused_by_the_token_endpoints(served_schema, server_errors):
    for body in (f'{{"tokens": [1, {"9" * 5000}]}}'.encode(), f'{{"tokens": {"[" * 30_000}{"]" * 30_000}}}'.encode()):
        response = served_schema["/detokenize"]["POST"].Case(body=body, media_type="application/json").call()
        assert 400 <= response.status_code < 500, (body[:60], response.status_code, response.text[:300])
        check_error_body(response)
    assert not server_errors.records, [r.getMessage() for r in server_errors.records]
