"""Bound what slow, idle or too many clients can hold: a connection cap and deadlines for reading a request.

Uvicorn reads a request's headers with no time limit (its keep-alive timer only runs between
requests, and every byte received cancels it), so a client that trickles one byte every few
seconds holds its connection, and its file descriptor, for as long as it likes; a few hundred
of them exhaust the descriptors and the server stops accepting anyone.  Two pieces close that:

- `connection_protocol`: uvicorn's HTTP/1.1 protocol with a cap on open connections (one more
  is answered 503 and closed at once, so a flood costs no descriptor for long) and a deadline
  for the bytes of a request that no application is reading yet: its headers, counted from the
  connection's opening or the request's first byte, and the rest of a body the response has
  already answered.  A client past the deadline gets 408 and is disconnected.
- `BodyReadDeadline`: ASGI middleware that gives an application reading a body the same time,
  counted from the end of the headers, and answers 408 in the server's JSON error shape.

The cap and the deadline live in the protocol because nothing reaches the ASGI application
before the headers are complete.
"""
from __future__ import annotations

import asyncio
import json
import logging

import h11
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from serve.errors import error_body
from serve.metrics import ServerMetrics

log = logging.getLogger("serve.connections")

STATUS_LINES = {408: b"HTTP/1.1 408 Request Timeout", 503: b"HTTP/1.1 503 Service Unavailable"}


def read_timeout_message(timeout_s: float, part: str) -> str:
    return f"the request's {part} did not arrive within {timeout_s:g}s; send the whole request at once"


def raw_response(status: int, message: str, extra_headers: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """A complete HTTP/1.1 response with the server's JSON error body, for answering outside any application."""
    body = json.dumps(error_body(status, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close"), *extra_headers]
    return b"\r\n".join([STATUS_LINES[status], *(name + b": " + value for name, value in headers), b"", body])


def connection_protocol(max_connections: int, read_timeout_s: float, retry_after_s: int,
                        metrics: ServerMetrics) -> type[H11Protocol]:
    """Uvicorn's h11 protocol class with the connection cap and the read deadline; pass it as `http=`."""
    refusal = raw_response(503, f"server busy: {max_connections} connections are open, the most this server "
                                f"accepts; retry after {retry_after_s}s",
                           ((b"retry-after", str(retry_after_s).encode()),))
    timeout_reply = raw_response(408, read_timeout_message(read_timeout_s, "headers"))

    class LimitedH11Protocol(H11Protocol):
        read_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                log.warning("%s refused: %d connections open (limit %d)", self._client_name(),
                            len(self.connections) - 1, max_connections)
                metrics.connections_closed.inc(reason="over_limit")
                transport.write(refusal)
                transport.close()
                return
            self._update_read_deadline()

        def handle_events(self) -> None:
            super().handle_events()
            self._update_read_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._update_read_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_read_deadline()
            super().connection_lost(exc)

        def _owes_unread_bytes(self) -> bool:
            """The client owes bytes of a request that no application is reading: headers not yet
            complete (a new connection counts), or a body the response has already answered."""
            their, ours = self.conn.their_state, self.conn.our_state
            if their is h11.IDLE:
                # Between requests on a kept-alive connection nothing is owed: uvicorn's keep-alive timer runs.
                return self.cycle is None or bool(self.conn.trailing_data[0])
            return their is h11.SEND_BODY and ours in (h11.DONE, h11.MUST_CLOSE)

        def _update_read_deadline(self) -> None:
            if self.transport.is_closing() or not self._owes_unread_bytes():
                self._cancel_read_deadline()
            elif self.read_deadline is None:  # already armed: the deadline holds, however many bytes trickle in
                self.read_deadline = self.loop.call_later(read_timeout_s, self._read_timed_out)

        def _cancel_read_deadline(self) -> None:
            if self.read_deadline is not None:
                self.read_deadline.cancel()
                self.read_deadline = None

        def _read_timed_out(self) -> None:
            self.read_deadline = None
            if self.transport.is_closing():
                return
            received = bool(self.conn.trailing_data[0]) or self.conn.their_state is not h11.IDLE
            log.warning("%s disconnected: %s within %gs", self._client_name(),
                        "no complete request" if received else "no request", read_timeout_s)
            metrics.connections_closed.inc(reason="read_timeout")
            if self.conn.our_state is h11.IDLE and received:  # a request started and no response has
                self.transport.write(timeout_reply)
            self.transport.close()

        def _client_name(self) -> str:
            return "%s:%d" % self.client if self.client else "client"

    return LimitedH11Protocol


class BodyTimedOut(HTTPException):
    """Raised while an application waits for a body past the deadline; the error handlers answer 408."""

    def __init__(self, timeout_s: float):
        super().__init__(status_code=408, detail=read_timeout_message(timeout_s, "body"),
                         headers={"Connection": "close"})


class BodyReadDeadline:
    """ASGI middleware: the body must arrive within `timeout_s` of the headers.  Later reads (a route
    waiting for its client to disconnect) have no deadline."""

    def __init__(self, app: ASGIApp, timeout_s: float):
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        body_complete = False

        async def receive_before_deadline() -> Message:
            nonlocal body_complete
            if body_complete:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0))
            except TimeoutError:
                raise BodyTimedOut(self.timeout_s) from None
            body_complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, receive_before_deadline, send)
