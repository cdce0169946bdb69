"""Hand the events of one engine step to each event loop in one call.

The engine's thread sends each request's events through its `on_event`; an HTTP request's (serve/submission.py)
puts them here, beside the event loop that reads them.  When the engine has run a prefill or a step it calls
`flush`, and every event of that pass reaches its loop in one `call_soon_threadsafe`: the loop wakes once per
step for all its streams, not once per event per request.  The engine only calls `flush`; what a destination is
(an asyncio loop) is this module's business.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

# (deliver, its argument, what to call instead when the loop has closed)
Pending = tuple[Callable[[Any], None], Any, Callable[[], None]]


class Delivery:
    """Calls bound for event loops, held until the engine's pass ends.  Used from the engine's thread alone."""

    def __init__(self):
        self.pending: dict[asyncio.AbstractEventLoop, list[Pending]] = {}

    def send(self, loop: asyncio.AbstractEventLoop, deliver: Callable[[Any], None], argument: Any,
             undeliverable: Callable[[], None]) -> None:
        """Run `deliver(argument)` on `loop` once this pass ends, after what was sent to it before; if the loop has
        closed by then, call `undeliverable()` instead, on this thread."""
        self.pending.setdefault(loop, []).append((deliver, argument, undeliverable))

    def flush(self) -> None:
        """Hand each loop what was sent to it since the last flush, in one call."""
        pending, self.pending = self.pending, {}
        for loop, calls in pending.items():
            try:
                loop.call_soon_threadsafe(run_in_order, calls)
            except RuntimeError:  # the event loop has closed: nobody is waiting any more
                for _, _, undeliverable in calls:
                    undeliverable()


def run_in_order(calls: list[Pending]) -> None:
    for deliver, argument, _ in calls:
        deliver(argument)
