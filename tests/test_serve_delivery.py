"""serve/delivery.py: a pass's events reach each event loop in one call, in order; a closed loop cancels."""
from __future__ import annotations

import asyncio

from serve.delivery import Delivery


class CountingLoop:
    """Stands in for an event loop: counts the calls handed to it and runs them at once."""

    def __init__(self, closed: bool = False):
        self.calls = 0
        self.closed = closed

    def call_soon_threadsafe(self, fn, *args):
        if self.closed:
            raise RuntimeError("Event loop is closed")
        self.calls += 1
        fn(*args)


def test_one_call_per_loop_per_flush_in_order():
    delivery, first, second = Delivery(), CountingLoop(), CountingLoop()
    got: list[tuple[str, int]] = []
    for i in range(3):
        delivery.send(first, got.append, ("a", i), lambda: None)
        delivery.send(second, got.append, ("b", i), lambda: None)
    assert got == [] and first.calls == second.calls == 0  # nothing moves before the pass ends
    delivery.flush()
    assert first.calls == second.calls == 1
    assert [e for e in got if e[0] == "a"] == [("a", 0), ("a", 1), ("a", 2)]
    assert [e for e in got if e[0] == "b"] == [("b", 0), ("b", 1), ("b", 2)]
    delivery.flush()  # nothing pending: no call
    assert first.calls == second.calls == 1


def test_a_closed_loop_cancels_what_was_sent_to_it():
    delivery, closed = Delivery(), CountingLoop(closed=True)
    cancelled: list[int] = []
    for i in range(2):
        delivery.send(closed, lambda _: None, i, lambda i=i: cancelled.append(i))
    delivery.flush()
    assert cancelled == [0, 1]


def test_events_reach_a_real_loop_from_another_thread():
    async def main():
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        delivery = Delivery()
        for i in range(4):
            delivery.send(loop, queue.put_nowait, i, lambda: None)
        await asyncio.to_thread(delivery.flush)
        return [await queue.get() for _ in range(4)]

    assert asyncio.run(main()) == [0, 1, 2, 3]
