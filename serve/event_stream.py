"""Server-sent event responses that end with an error event, not a cut connection, when the server shuts down.

Uvicorn cancels the requests still running at the graceful-shutdown deadline (--graceful-shutdown-s).  A stream
answered 200 long before; cancelled as it is, it would stop mid-body with no word of why, and uvicorn would log
the CancelledError's traceback.  Instead its last event says that the server shut down, and the response ends
whole.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable

from fastapi.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from serve.errors import APIError, error_response, shutdown_error

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventStream(StreamingResponse):
    """`events` as text/event-stream; `error_event` renders an error in the route's own stream form."""

    def __init__(self, events: AsyncIterator[str], error_event: Callable[[APIError], str], retry_after_s: int):
        super().__init__(events, media_type="text/event-stream", headers=SSE_HEADERS)
        self.error_event = error_event
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sent = {"head": False, "end": False}

        async def send_and_watch(message: Message) -> None:
            sent["head"] = sent["head"] or message["type"] == "http.response.start"
            sent["end"] = message["type"] == "http.response.body" and not message.get("more_body", False)
            await send(message)

        try:
            await super().__call__(scope, receive, send_and_watch)
        except asyncio.CancelledError:
            # Only the server's shutdown cancels a request from outside: a client that disconnects ends the
            # stream inside StreamingResponse, which returns normally.
            error = shutdown_error(self.retry_after_s)
            if not sent["head"]:
                await error_response(error)(scope, receive, send)
            elif not sent["end"]:
                await send({"type": "http.response.body", "body": self.error_event(error).encode(),
                            "more_body": False})
