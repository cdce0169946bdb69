"""One log line and one metrics count per HTTP request, written when its response ends (streams included)."""
from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve.metrics import ServerMetrics

log = logging.getLogger("serve.requests")


def loggable(path: str) -> str:
    """The path as one field of one line: the server percent-decodes it, so `%0A` would end the line and let a
    client write a forged line of its own; control characters, spaces and backslashes become \\xNN escapes."""
    return "".join(c if c.isprintable() and c not in " \\" else f"\\x{ord(c):02x}" if ord(c) < 256
                   else f"\\u{ord(c):04x}" for c in path)


class RequestLog:
    """ASGI middleware.  Paths outside `known_paths` are counted as "other", so that random
    URLs cannot grow the metrics without bound."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics, known_paths: set[str]):
        self.app = app
        self.metrics = metrics
        self.known_paths = known_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 0
        body_bytes = 0

        async def send_and_watch(message: Message) -> None:
            nonlocal status, body_bytes
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                body_bytes += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            # No response started means the app raised; the server answers 500.
            status = status or 500
            path = scope["path"]
            client = scope.get("client") or ("-", 0)
            log.info("%s %s %s %d %.1fms %dB", client[0], scope["method"], loggable(path), status,
                     1000 * (time.perf_counter() - start), body_bytes)
            self.metrics.requests.inc(path=path if path in self.known_paths else "other", status=str(status))
