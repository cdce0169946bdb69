"""Start-up's rehearsal: a few real requests through the whole application, in the process, before /health says
ready, so that the first client's request does not pay what only a first request pays.

The engine's warm-up (serve/warm_up.py) makes the model's steps.  What it cannot reach lies above the engine:
the async backend Starlette imports on the first streamed or threaded response (anyio's asyncio module), the
first validation and serialization of each route's schemas, the first SSE stream and its log-probabilities.  On a
busy 2-core host those made a fresh server's first request many times slower than its second, whatever the model's
size; `python -m bench.experiments first_request` measures the first burst against the tenth
(bench/results/first_request.json).

The requests go through the application as a client's would (every middleware, the routes, the engine) but not
through a socket: their scope names the rehearsal as the client, so the log says what they were, and the metrics
they counted are cleared afterwards.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from fastapi import FastAPI

from serve.state import ServerState

log = logging.getLogger("serve")

CLIENT = "start-up-rehearsal"  # the client address the request log shows for these requests
# Each door and form a client's first request may take: streamed and whole, sampled and greedy, with
# log-probabilities; a short prompt and two tokens, since the model's own steps are warmed up already.
REQUESTS = (
    ("/generate", {"prompt": "Hello", "max_new_tokens": 2, "stream": True, "logprobs": 2, "seed": 0,
                   "temperature": 0.8, "top_k": 40}),
    ("/generate", {"prompt": "Hello", "max_new_tokens": 2, "temperature": 0}),
    ("/v1/completions", {"model": None, "prompt": "Hello", "max_tokens": 2, "stream": True, "logprobs": 2,
                         "seed": 0}),
    ("/v1/completions", {"model": None, "prompt": "Hello", "max_tokens": 2, "temperature": 0}),
    ("/tokenize", {"prompt": "Hello"}),
)
NEW_TOKENS = ("max_new_tokens", "max_tokens")  # each door's count, cut to what the model's context leaves


async def rehearse(app: FastAPI, state: ServerState) -> None:
    """Send REQUESTS through `app` (a `model` of None becomes the served model's id).  A reply other than 200 is
    logged as a warning with its body (a server error there is one the clients will meet; a --request-timeout-s
    shorter than two tokens take answers 504), and the start-up goes on: the path has run either way."""
    started = time.perf_counter()
    room = state.block_size - 1  # new tokens beside the one-token prompt
    if room < 1:
        log.warning("the model's context of %d token holds a prompt and no new token: every request to generate "
                    "will be refused (422); serve a model with a longer context", state.block_size)
    for path, body in REQUESTS:
        body = {k: state.model_id if k == "model" else min(v, room) if k in NEW_TOKENS else v
                for k, v in body.items()}
        if any(body.get(k) == 0 for k in NEW_TOKENS):
            continue
        try:
            status, reply = await _request(app, path, body, next(iter(state.api_keys), None))
        except Exception as e:  # Starlette re-raises a route's error after answering 500
            status, reply = 500, f"{type(e).__name__}: {e}".encode()
        if status != 200:
            log.warning("start-up rehearsal: POST %s answered %d: %s", path, status, reply[:300].decode(errors="replace"))
    state.metrics.reset()
    log.info("rehearsed %d requests in %.1fs", len(REQUESTS), time.perf_counter() - started)


async def _request(app: FastAPI, path: str, body: dict, api_key: str | None) -> tuple[int, bytes]:
    """POST `body` as JSON to `path` of the ASGI `app`; the status and the whole reply."""
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if api_key:
        headers.append((b"authorization", f"Bearer {api_key}".encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
             "client": (CLIENT, 0), "server": ("127.0.0.1", 0)}
    sent, status, reply = False, 0, bytearray()

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        # A client that stays connected until the reply ends: a route watching for a disconnect waits here, and is
        # cancelled when its reply is complete.
        await asyncio.Event().wait()

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            reply.extend(message.get("body", b""))

    await app(scope, receive, send)
    return status, bytes(reply)

