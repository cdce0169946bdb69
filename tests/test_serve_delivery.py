"""serve/delivery.py: a pass's events reach each event loop in one call, in order, at most once per stream interval
but for ends and first tokens; a closed loop cancels."""
from __future__ import annotations

import asyncio
import gc

import pytest
import torch

from decode.sampling import SamplingParams
from model.gpt import GPT
from serve.delivery import Delivery
from serve.engine import Engine
from serve.submission import Submission
from tests.conftest import small_config
from tests.test_serve_engine import SlowModel


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


def test_a_loop_that_is_gone_is_forgotten():
    delivery, loop = Delivery(interval_s=1.0), CountingLoop()
    delivery.send(loop, lambda _: None, 0, lambda: None)
    delivery.flush()
    assert list(delivery.handed_at) == [loop]
    del loop
    gc.collect()
    assert len(delivery.handed_at) == 0 and delivery.pending == {}


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


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_within_the_interval_tokens_wait_for_a_later_hand_over():
    clock, loop, got = FakeClock(), CountingLoop(), []
    delivery = Delivery(interval_s=0.02, clock=clock)
    delivery.send(loop, got.append, 0, lambda: None)
    delivery.flush()  # nothing was handed to this loop before: due at once
    assert got == [0] and loop.calls == 1
    clock.now += 0.019
    delivery.send(loop, got.append, 1, lambda: None)
    delivery.flush()
    clock.now += 0.0009
    delivery.send(loop, got.append, 2, lambda: None)
    delivery.flush()
    assert got == [0] and loop.calls == 1  # 19.9 ms since the last hand-over
    clock.now += 0.0001
    delivery.flush()  # 20 ms: both held tokens go, in one call, in order
    assert got == [0, 1, 2] and loop.calls == 2


def test_an_urgent_event_or_force_goes_at_once_with_what_was_held_before_it():
    clock, loop, other, got = FakeClock(), CountingLoop(), CountingLoop(), []
    delivery = Delivery(interval_s=1.0, clock=clock)
    for target in (loop, other):
        delivery.send(target, got.append, "start", lambda: None)
    delivery.flush()
    delivery.send(loop, got.append, "token", lambda: None)
    delivery.send(other, got.append, "held", lambda: None)
    delivery.send(loop, got.append, "done", lambda: None, urgent=True)
    delivery.flush()  # the urgent event's loop alone
    assert got == ["start", "start", "token", "done"] and (loop.calls, other.calls) == (2, 1)
    delivery.send(loop, got.append, "next", lambda: None)
    delivery.flush()  # urgency lasts for one hand-over only
    assert loop.calls == 2
    delivery.flush(force=True)
    assert got[-2:] in (["held", "next"], ["next", "held"]) and (loop.calls, other.calls) == (3, 2)


def test_a_closed_loop_cancels_what_was_held_for_it():
    clock, closed, cancelled = FakeClock(), CountingLoop(closed=True), []
    delivery = Delivery(interval_s=1.0, clock=clock)
    delivery.send(closed, lambda _: None, 0, lambda: cancelled.append(0))
    delivery.flush()
    assert cancelled == [0] and not delivery.pending


def test_a_negative_interval_is_refused():
    with pytest.raises(ValueError, match="at least 0 s"):
        Delivery(interval_s=-0.001)


class RecordingLoop:
    """A real event loop's call_soon_threadsafe, recording what each hand-over carried."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.hand_overs: list[list] = []
        self.queues: list[list] = []  # the queue each argument was put in: which submission it belongs to

    def call_soon_threadsafe(self, fn, calls):
        self.hand_overs.append([argument for _, argument, _ in calls])
        self.queues.append([deliver.__self__ for deliver, _, _ in calls])
        self.loop.call_soon_threadsafe(fn, calls)


@pytest.mark.parametrize("streamed, interval_s, sizes", [(True, 0.0, [1, 1, 1, 1, 1, 2]), (True, 1.0, [1, 6]),
                                                         (False, 0.0, [1])])
def test_a_stream_is_held_between_its_first_token_and_its_end_within_the_interval(streamed, interval_s, sizes):
    """Through the engine and a request's submission: the first token goes as its prefill ends, and with an
    interval no step's tokens go before the end (the clock stands still), which takes everything held.  Two
    requests in turn from one event loop: the second's first token is not held for the first's hand-overs.  A
    request that is not streamed is handed its end alone."""
    torch.manual_seed(0)
    model = GPT(small_config(block_size=32, vocab_size=512)).eval()
    engine = Engine(model, torch.device("cpu"), max_batch_size=2, max_queue=2, request_timeout_s=60,
                    decode="dynamic", stream_interval_s=interval_s)
    engine.delivery.clock = FakeClock()
    params = SamplingParams(max_new_tokens=6, temperature=0.0, stop_at_eot=False)

    async def stream(recording: RecordingLoop) -> list[str]:
        submission = Submission(engine, [([1, 2, 3], params, [])], retry_after_s=1, streamed=streamed)
        submission.loop = recording
        submission.submit()
        return [type(event).__name__ async for batch in submission.event_batches() for _, event in batch]

    async def two_in_turn() -> tuple[list[list[str]], RecordingLoop]:
        recording = RecordingLoop(asyncio.get_running_loop())
        return [await asyncio.wait_for(stream(recording), 60) for _ in range(2)], recording

    engine.start()
    try:
        kinds, recording = asyncio.run(two_in_turn())
    finally:
        engine.stop()
    assert kinds == [["TokenEvent"] * 6 * streamed + ["DoneEvent"]] * 2
    assert [len(hand_over) for hand_over in recording.hand_overs] == sizes * 2


def test_tokens_held_for_a_stream_go_before_another_request_is_prefilled():
    """A prefill is long: what a stream holds goes before it, not after it with the new request's first token."""
    torch.manual_seed(0)
    model = SlowModel(GPT(small_config(block_size=64, vocab_size=512)).eval(), delay_s=0.01)
    engine = Engine(model, torch.device("cpu"), max_batch_size=2, max_queue=2, request_timeout_s=60,
                    decode="dynamic", stream_interval_s=1.0)
    engine.delivery.clock = FakeClock()

    async def main() -> tuple[RecordingLoop, Submission, Submission]:
        recording = RecordingLoop(asyncio.get_running_loop())
        submissions = []
        for prompt, new_tokens in (([1, 2, 3], 40), ([4, 5], 2)):
            params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, stop_at_eot=False)
            submission = Submission(engine, [(prompt, params, [])], retry_after_s=1)
            submission.loop = recording
            submission.submit()
            submissions.append(submission)
            while engine.metrics.tokens.values.get((), 0) < 3:  # the first's prefill and two steps: two held
                await asyncio.sleep(0.002)

        async def drain(submission: Submission) -> None:
            async for _ in submission.event_batches():
                pass

        await asyncio.wait_for(asyncio.gather(*map(drain, submissions)), 60)
        return recording, *submissions

    engine.start()
    try:
        recording, first, second = asyncio.run(main())
    finally:
        engine.stop()
    owners = [{queue for queue in queues} for queues in recording.queues]
    second_starts = next(i for i, queues in enumerate(owners) if second.queue in queues)
    assert owners[second_starts] == {second.queue}
    assert owners[second_starts - 1] == {first.queue} and len(recording.hand_overs[second_starts - 1]) >= 2
