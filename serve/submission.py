"""Carry one HTTP request's generations from the engine thread to the event loop.

A submission holds one or more engine requests (an OpenAI request may ask for several
completions) that deliver their events into one asyncio queue, tagged with their index.
Whoever reads the events cancels the submission when done or when the client goes away, so a
client that disconnects frees its batch rows at the engine's next step.
"""
from __future__ import annotations

import asyncio
import functools
from typing import AsyncIterator

from fastapi import Request

from decode.sampling import SamplingParams
from serve.engine import Engine, RequestRejected
from serve.events import DoneEvent, ErrorEvent, Event, GenerationRequest, TokenEvent
from serve.scheduler import EngineStopped, QueueFull
from serve.errors import APIError, shutdown_error


class Submission:
    def __init__(self, engine: Engine, jobs: list[tuple[list[int], SamplingParams, list[str]]], retry_after_s: int,
                 logprobs: int | None = None, echo: bool = False, streamed: bool = True, cache_salt: bytes = b""):
        """`streamed`: read through `event_batches`, token by token; a submission that is not waits for the ends
        alone (`results`), and its tokens never wake the event loop.  `cache_salt`: the client's prefix-cache
        salt (ServerState.cache_salt)."""
        self.engine = engine
        self.streamed = streamed
        self.retry_after_s = retry_after_s
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.requests = [GenerationRequest(ids, params, functools.partial(self._deliver, i), stop, logprobs, echo,
                                           cache_salt=cache_salt)
                         for i, (ids, params, stop) in enumerate(jobs)]
        self.open = set(range(len(jobs)))
        self.submitted = False

    def _deliver(self, index: int, event: Event) -> None:
        if not self.streamed and isinstance(event, TokenEvent):
            return
        # Queued on the loop when the engine's pass ends, or a later one within the stream interval
        # (serve/delivery.py); an end or an error goes at once.  A closed loop cancels the request.
        self.engine.delivery.send(self.loop, self.queue.put_nowait, (index, event), self.requests[index].cancel,
                                  urgent=not isinstance(event, TokenEvent))

    def submit(self) -> None:
        """Queue every generation, or none: a full queue answers 503 with Retry-After."""
        try:
            for request in self.requests:
                self.engine.submit(request)
        except RequestRejected as e:  # the route's own checks came first, in its fields' names: not expected
            self.cancel()
            raise APIError(422, f"the request cannot run on this model: {e}", param=e.field) from e
        except (QueueFull, EngineStopped) as e:
            self.cancel()
            raise APIError(503, f"server busy: {e}; retry after {self.retry_after_s}s", code="overloaded",
                           headers={"Retry-After": str(self.retry_after_s)}) from e
        self.submitted = True

    def cancel(self) -> None:
        """Stop whatever still generates; every reader calls this when it ends.  A submission stopped before
        its generations finished (its client went away) counts in serve_requests_cancelled_total."""
        if self.submitted and any(not self.requests[i].cancelled for i in self.open):
            self.engine.metrics.cancelled.inc()
        for request in self.requests:
            request.cancel()

    async def event_batches(self) -> AsyncIterator[list[tuple[int, Event]]]:
        """Lists of (index, event), each everything that arrived since the last, until every
        generation is done (a slow reader gets fewer, larger batches: one write per batch)."""
        while self.open:
            batch = [await self.queue.get()]
            while not self.queue.empty():
                batch.append(self.queue.get_nowait())
            for index, event in batch:
                if isinstance(event, (DoneEvent, ErrorEvent)):
                    self.open.discard(index)
            yield batch

    async def results(self, client: Request) -> list[DoneEvent]:
        """Wait for every generation; an engine error becomes the HTTP error that says what happened.

        The client's connection is watched meanwhile: when it closes, the generations are cancelled
        at once (streams learn of a disconnect from Starlette instead)."""
        collecting = asyncio.ensure_future(self._collect())
        watching = asyncio.ensure_future(wait_for_disconnect(client))
        try:
            await asyncio.wait({collecting, watching}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # Uvicorn cancels the requests still running at the graceful-shutdown deadline, and answers a
            # plain-text 500 for any that has not started its response: answer for them, in the JSON shape.
            raise shutdown_error(self.retry_after_s) from None
        finally:
            watching.cancel()
            collecting.cancel()
            self.cancel()
        if not collecting.done():
            raise APIError(499, "client closed the request before generation finished")
        return collecting.result()

    async def _collect(self) -> list[DoneEvent]:
        done: dict[int, DoneEvent] = {}
        async for batch in self.event_batches():
            for index, event in batch:
                if isinstance(event, ErrorEvent):
                    raise error_for(event)
                if isinstance(event, DoneEvent):
                    done[index] = event
        return [done[i] for i in range(len(self.requests))]


async def wait_for_disconnect(client: Request) -> None:
    """Return when the client closes its connection.  Called after the body was read, when the
    server's `receive` has nothing left to deliver but the disconnect."""
    while (await client.receive())["type"] != "http.disconnect":
        pass


def error_for(event: ErrorEvent) -> APIError:
    status = 504 if event.kind == "timeout" else 500
    return APIError(status, event.message, code=event.kind)
