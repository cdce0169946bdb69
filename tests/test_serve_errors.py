"""serve/errors.py on its own, without a model: the error type each status gets (what the `openai` client maps to
its exception classes), the field a validation error names, the one message per field, and the message each
HTTP failure gets -- on a bare app with the handlers installed, so a changed status, position or condition fails
here in about a second."""
from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from serve.errors import (APIError, describe_validation_error, error_body, field_path, informative,
                          install_error_handlers, shutdown_error, too_large_message)
from serve.schemas import CompletionRequest, GenerateRequest

# OpenAI's error types by status, as its API sends them and its client reads them.
OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
                422: "invalid_request_error", 499: "client_closed_request", 500: "server_error",
                503: "overloaded_error", 504: "timeout_error"}


@pytest.mark.parametrize("status", [*OPENAI_TYPES, 402, 409, 418, 429, 498, 501, 502, 505])
def test_each_status_gets_its_openai_error_type_and_any_other_is_an_invalid_request(status):
    assert error_body(status, "why", "field", "the_code") == {"error": {
        "message": "why", "type": OPENAI_TYPES.get(status, "invalid_request_error"), "param": "field",
        "code": "the_code"}}
    assert error_body(status, "why") == {"error": {"message": "why", "type": OPENAI_TYPES.get(
        status, "invalid_request_error"), "param": None, "code": None}}


def test_a_shutdown_error_is_a_503_to_retry_after_the_given_seconds():
    error = shutdown_error(7)
    assert (error.status, error.code, error.param, error.headers) == (503, "shutting_down", None, {"Retry-After": "7"})
    assert error.message.startswith("the server shut down before this request finished; retry it")
    assert too_large_message(4096) == "request body is larger than the limit of 4096 bytes"


@pytest.mark.parametrize("loc, path", [
    ((), "body"), (("body",), "body"), (("body", "stop"), "stop"), (("body", "stop", 0), "stop[0]"),
    (("body", "stop", "list[constrained-str]", 2), "stop[2]"), (("body", "prompt", "list[list[int]]", 1, 5),
                                                                "prompt[1][5]"),
    (("body", "prompt", "str"), "prompt"), (("body", 3), "3")])
def test_a_field_path_keeps_the_field_and_its_list_positions_without_type_tags(loc, path):
    assert field_path(loc) == path


def errors_of(model, body: dict) -> list[dict]:
    """The validation errors of `body` as FastAPI reports them (each location under "body")."""
    with pytest.raises(ValidationError) as refused:
        model.model_validate(body)
    return [{**e, "loc": ("body", *e["loc"])} for e in refused.value.errors()]


COMPLETION = {"model": "tiny", "prompt": "Hello"}


def test_a_union_field_keeps_the_error_of_the_alternative_with_the_right_type():
    # stop: a string or a list of strings; five strings break the list's bound and are not a string.
    errors = errors_of(CompletionRequest, {**COMPLETION, "stop": ["a", "b", "c", "d", "e"]})
    assert sorted(e["type"] for e in errors) == ["string_type", "too_long"]
    assert [e["type"] for e in informative(errors)] == ["too_long"]
    assert describe_validation_error(errors, CompletionRequest) == (
        422, "stop: List should have at most 4 items after validation, not 5", "stop")


def test_a_union_field_of_no_right_type_keeps_every_alternative_and_other_fields_keep_theirs():
    errors = errors_of(GenerateRequest, {"prompt": "hi", "stop": 5, "seed": -1})
    kinds = sorted(e["type"] for e in errors)
    assert kinds == ["greater_than_equal", "list_type", "string_type"]
    assert sorted(e["type"] for e in informative(errors)) == kinds  # nothing dropped: each field's own
    status, message, param = describe_validation_error(errors, GenerateRequest)
    assert (status, param) == (422, "seed")  # the first field in the schema's order
    assert message == "seed: Input should be greater than or equal to 0; stop: Input should be a valid string"


def test_errors_are_grouped_by_field_not_by_alternative_or_body():
    # A list of one constrained error and one type error in the same field: the type error goes; a lone
    # constrained error stays, and so does each field's when two fields fail.
    constraint = {"type": "too_long", "loc": ("body", "stop", "list[str]"), "msg": "too long"}
    wrong_type = {"type": "string_type", "loc": ("body", "stop", "str"), "msg": "not a string"}
    other = {"type": "int_type", "loc": ("body", "seed"), "msg": "not an integer"}
    assert informative([wrong_type, constraint]) == [constraint]
    assert informative([wrong_type, other]) == [wrong_type, other]
    assert informative([constraint, other]) == [constraint, other]
    assert informative([constraint]) == [constraint]
    two = {**constraint, "type": "too_short"}
    assert informative([constraint, two]) == [constraint, two]


@pytest.mark.parametrize("loc, where", [(("body", 17), "at character 17"), (("body",), "at character ?"),
                                        ((), "at character ?")])
def test_a_body_that_is_not_json_is_a_400_naming_the_character(loc, where):
    errors = [{"type": "json_invalid", "loc": loc, "msg": "JSON decode error", "ctx": {"error": "Expecting value"}}]
    assert describe_validation_error(errors, GenerateRequest) == (
        400, f"request body is not valid JSON: Expecting value {where}", "body")
    errors = [{"type": "json_invalid", "loc": loc, "msg": "JSON decode error"}]
    assert describe_validation_error(errors, None)[1] == f"request body is not valid JSON: decode error {where}"


def test_each_kind_of_field_error_gets_its_one_message():
    unknown = errors_of(GenerateRequest, {"prompt": "hi", "bogus": 1})
    assert describe_validation_error(unknown, GenerateRequest) == (
        422, f"unknown field 'bogus'; the accepted fields are {', '.join(GenerateRequest.model_fields)}", "bogus")
    assert describe_validation_error(unknown, None) == (422, "unknown field 'bogus'", "bogus")
    missing = errors_of(CompletionRequest, {"prompt": "hi"})
    assert describe_validation_error(missing, CompletionRequest) == (422, "model is required", "model")
    across = errors_of(CompletionRequest, {**COMPLETION, "max_tokens": 0})
    assert describe_validation_error(across, CompletionRequest) == (
        422, "max_tokens: 0 generates nothing; it is allowed only with echo (to score the prompt)", "body")
    not_object = errors_of(GenerateRequest, [1, 2])
    assert describe_validation_error([{**e, "loc": ("body",)} for e in not_object], GenerateRequest) == (
        422, "request body: Input should be a valid dictionary or instance of GenerateRequest (send a JSON object "
             "with Content-Type: application/json)", "body")
    suffix = errors_of(CompletionRequest, {**COMPLETION, "suffix": "x"})
    assert describe_validation_error(suffix, CompletionRequest) == (
        422, "suffix: suffix (insertion) is not supported by this server; leave it out", "suffix")


def test_two_errors_in_one_field_give_one_message_and_the_first_field_is_the_param():
    first = {"type": "too_short", "loc": ("body", "prompt"), "msg": "too short"}
    second = {"type": "string_pattern_mismatch", "loc": ("body", "prompt"), "msg": "odd"}
    third = {"type": "greater_than", "loc": ("body", "top_p"), "msg": "above 0"}
    assert describe_validation_error([first, second, third], GenerateRequest) == (
        422, "prompt: too short; top_p: above 0", "prompt")


@pytest.fixture(scope="module")
def app_client():
    """A bare app with the handlers installed: no model, only routes that fail as the real ones do."""
    app = FastAPI()
    install_error_handlers(app, {"/generate": GenerateRequest}, max_body_bytes=1000)

    @app.post("/generate")
    def generate(body: GenerateRequest):
        return {"ok": body.prompt}

    @app.post("/completions")
    def completions(body: CompletionRequest):  # no schema registered for its path
        return {"ok": True}

    @app.get("/fail/{status}")
    def fail(status: int):
        if status == 999:
            raise RuntimeError("secret internal detail")
        if status == 998:
            raise APIError(409, "taken", "name", code="conflict", headers={"X-Why": "taken"})
        raise HTTPException(status, detail=f"detail {status}", headers={"Retry-After": "3"} if status == 503 else None)

    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def test_each_http_failure_gets_its_message_type_and_headers(app_client):
    def error(response, status):
        assert response.status_code == status, response.text
        return response.json()["error"]

    assert error(app_client.get("/nowhere"), 404) == {
        "message": "no endpoint at /nowhere; see GET /docs for the endpoints", "type": "not_found_error",
        "param": None, "code": None}
    assert error(app_client.put("/generate"), 405)["message"] == "PUT is not allowed on /generate"
    assert error(app_client.get("/fail/413"), 413) == {
        "message": "request body is larger than the limit of 1000 bytes", "type": "invalid_request_error",
        "param": "body", "code": "body_too_large"}
    assert error(app_client.get("/fail/400"), 400)["message"] == (
        "request body could not be read as JSON (detail 400); send a UTF-8 JSON object")
    busy = app_client.get("/fail/503")
    assert error(busy, 503) == {"message": "detail 503", "type": "overloaded_error", "param": None, "code": None}
    assert busy.headers["retry-after"] == "3"
    assert error(app_client.get("/fail/399"), 399)["message"] == "detail 399"  # any other status: its detail
    assert error(app_client.get("/fail/401"), 401)["message"] == "detail 401"
    conflict = app_client.get("/fail/998")
    assert error(conflict, 409) == {"message": "taken", "type": "invalid_request_error", "param": "name",
                                    "code": "conflict"}
    assert conflict.headers["x-why"] == "taken"


def test_an_unexpected_exception_is_a_500_without_its_text(app_client, caplog):
    with caplog.at_level("ERROR", logger="serve"):
        response = app_client.get("/fail/999")
    assert response.status_code == 500
    assert response.json() == {"error": {"message": "internal server error; the server log has the details",
                                         "type": "server_error", "param": None, "code": None}}
    assert "secret internal detail" not in response.text
    assert "unhandled error on GET /fail/999" in caplog.text


def test_a_validation_error_names_the_field_and_the_schema_of_its_path(app_client):
    refused = app_client.post("/generate", json={"prompt": "hi", "bogus": 1}).json()["error"]
    assert refused == {"message": f"unknown field 'bogus'; the accepted fields are "
                                  f"{', '.join(GenerateRequest.model_fields)}", "type": "invalid_request_error",
                       "param": "bogus", "code": "invalid_value"}
    other = app_client.post("/completions", json={**COMPLETION, "bogus": 1}).json()["error"]
    assert other["message"] == "unknown field 'bogus'"  # no schema listed for this path
    broken = app_client.post("/generate", content=b'{"prompt": ', headers={"content-type": "application/json"})
    assert broken.status_code == 400 and broken.json()["error"]["param"] == "body"
    assert broken.json()["error"]["message"].startswith("request body is not valid JSON: ")
