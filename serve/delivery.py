"""Hand the engine's events to each event loop in one call per pass, and with a stream interval, at most once per
interval.

The engine's thread sends each request's events through its `on_event`; an HTTP request's (serve/submission.py)
puts them here, beside the event loop that reads them.  When the engine has run a prefill or a step it calls
`flush`, and every event held for a loop reaches it in one `call_soon_threadsafe`: the loop wakes once per step
for all its streams, not once per event per request.

Each wake-up costs the loop its Python (the chunks, the writes) on the cores the next step's threads need, about
as much per wake-up whatever it carries.  With `interval_s` above zero a loop is handed its tokens at most once per
interval: a step's tokens wait for a later step's hand-over until the interval since the last one has passed, as
vLLM's `--stream-interval` holds them for a count of tokens.  What a client waits on is never held: an event
sent `urgent` (a request's end or error) goes with the pass that made it, with everything held before it, and
the engine forces the hand-over before a prefill (nothing waits through it) and after one (a first token).  The
engine only calls `flush`; what a destination is (an asyncio loop) is this module's business.
"""
from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any, Callable

# (deliver, its argument, what to call instead when the loop has closed)
Pending = tuple[Callable[[Any], None], Any, Callable[[], None]]


class Delivery:
    """Calls bound for event loops, held until a pass ends.  Used from the engine's thread alone."""

    def __init__(self, interval_s: float = 0.0, clock: Callable[[], float] = time.perf_counter):
        """`interval_s`: the least time between two hand-overs to one loop, unless an urgent event or `force`
        makes one sooner; 0 hands over every pass's events as it ends."""
        if interval_s < 0:
            raise ValueError(f"a stream interval is a duration, at least 0 s, not {interval_s}")
        self.interval_s = interval_s
        self.clock = clock
        self.pending: dict[asyncio.AbstractEventLoop, list[Pending]] = {}
        self.urgent: set[asyncio.AbstractEventLoop] = set()
        # each loop's last hand-over, forgotten with the loop (a test client, say, makes a loop per client)
        self.handed_at: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def send(self, loop: asyncio.AbstractEventLoop, deliver: Callable[[Any], None], argument: Any,
             undeliverable: Callable[[], None], urgent: bool = False) -> None:
        """Run `deliver(argument)` on `loop`, after what was sent to it before, at the end of this pass (`urgent`)
        or of a later one; if the loop has closed by then, call `undeliverable()` instead, on this thread."""
        self.pending.setdefault(loop, []).append((deliver, argument, undeliverable))
        if urgent:
            self.urgent.add(loop)

    def flush(self, force: bool = False) -> None:
        """Hand each loop what was sent to it, in one call, where that is due: `force`, an urgent event, or the
        interval passed since its last hand-over."""
        now = self.clock()
        for loop in list(self.pending):
            if not (force or loop in self.urgent or now - self.handed_at.get(loop, -float("inf")) >= self.interval_s):
                continue
            calls = self.pending.pop(loop)
            self.urgent.discard(loop)
            self.handed_at[loop] = now
            try:
                loop.call_soon_threadsafe(run_in_order, calls)
            except RuntimeError:  # the event loop has closed: nobody is waiting any more
                del self.handed_at[loop]
                for _, _, undeliverable in calls:
                    undeliverable()


def run_in_order(calls: list[Pending]) -> None:
    for deliver, argument, _ in calls:
        deliver(argument)
