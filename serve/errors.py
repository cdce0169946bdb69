"""One error shape for every failure, OpenAI's: {"error": {"message", "type", "param", "code"}}.

The official `openai` client reads `error.message` from it, and a person reading a 4xx sees
which field was wrong and why.
"""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("serve")

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
               422: "invalid_request_error", 499: "client_closed_request", 500: "server_error",
               503: "overloaded_error", 504: "timeout_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error_body(error.status, error.message, error.param, error.code), status_code=error.status,
                        headers=error.headers)


def shutdown_error(retry_after_s: int) -> APIError:
    """For a request still running when the server shuts down (at its graceful-shutdown deadline)."""
    return APIError(503, "the server shut down before this request finished; retry it (on another instance, if "
                         "this one does not come back)", code="shutting_down",
                    headers={"Retry-After": str(retry_after_s)})


def too_large_message(limit: int) -> str:
    return f"request body is larger than the limit of {limit} bytes"


def field_path(loc: tuple) -> str:
    """("body", "stop", "list[str]", 0) -> "stop[0]": the field, and list positions, without pydantic's type tags."""
    if len(loc) < 2:
        return "body"
    path = str(loc[1])
    for part in loc[2:]:
        if isinstance(part, int):
            path += f"[{part}]"
    return path


def informative(errors: list[dict]) -> list[dict]:
    """A field typed as a union reports one error per alternative: when one alternative had the
    right type but broke a constraint, its error says what to fix; drop the wrong-type ones."""
    by_field: dict[object, list[dict]] = {}
    for error in errors:
        by_field.setdefault(tuple(error["loc"][:2]), []).append(error)
    kept = []
    for group in by_field.values():
        specific = [e for e in group if not e["type"].endswith("_type")]
        kept += specific if specific and len(specific) < len(group) else group
    return kept


def describe_validation_error(errors: list[dict], schema: type[BaseModel] | None) -> tuple[int, str, str]:
    """(status, message, param) for FastAPI's validation errors; one message per field."""
    first = errors[0]
    if first["type"] == "json_invalid":
        position = first["loc"][1] if len(first["loc"]) > 1 else "?"
        return 400, (f"request body is not valid JSON: {first.get('ctx', {}).get('error', 'decode error')} "
                     f"at character {position}"), "body"
    messages, params = {}, []
    for error in informative(errors):
        path = field_path(tuple(error["loc"]))
        if path in messages:
            continue
        params.append(path)
        if error["type"] == "extra_forbidden":
            known = f"; the accepted fields are {', '.join(schema.model_fields)}" if schema else ""
            messages[path] = f"unknown field {path!r}{known}"
        elif error["type"] == "missing":
            messages[path] = f"{path} is required"
        elif path == "body" and error["type"] == "value_error":  # a rule across fields: its message says the fix
            messages[path] = error["msg"].removeprefix("Value error, ")
        elif path == "body":  # the body itself is not an object
            messages[path] = f"request body: {error['msg']} (send a JSON object with Content-Type: application/json)"
        else:
            messages[path] = f"{path}: {error['msg'].removeprefix('Value error, ')}"
    return 422, "; ".join(messages.values()), params[0]


def install_error_handlers(app: FastAPI, schemas_by_path: dict[str, type[BaseModel]], max_body_bytes: int) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        status, message, param = describe_validation_error(list(exc.errors()), schemas_by_path.get(request.url.path))
        return error_response(APIError(status, message, param, code="invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 413:
            message = too_large_message(max_body_bytes)
            return error_response(APIError(413, message, "body", code="body_too_large"))
        if exc.status_code == 404:
            message = f"no endpoint at {request.url.path}; see GET /docs for the endpoints"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        elif exc.status_code == 400:
            message = f"request body could not be read as JSON ({exc.detail}); send a UTF-8 JSON object"
        else:
            message = str(exc.detail)
        return error_response(APIError(exc.status_code, message, headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        # The exception's name and text stay in the log: they can describe the server's internals.
        return error_response(APIError(500, "internal server error; the server log has the details"))
