"""Refuse request bodies over a size limit with a JSON 413, before reading more than the limit.

Starlette's own limiter answers a declared oversize Content-Length in plain text, past the
app's error handlers; this one keeps the server's one error shape.
"""
from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve.errors import error_body, too_large_message


class BodyTooLarge(HTTPException):
    """Raised while a body without a (truthful) Content-Length streams in; the error handlers answer 413."""

    def __init__(self):
        super().__init__(status_code=413, detail="request body too large")


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"").decode("latin-1")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            body = error_body(413, too_large_message(self.max_body_bytes), "body", "body_too_large")
            await JSONResponse(body, status_code=413)(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge()
            return message

        await self.app(scope, receive_within_limit, send)
