"""What runs next: the queue of waiting requests, admission (a full queue refuses), the requests that join the
batch as rows free up, and the ones that leave early, past their time limit (a cancelled one leaves at the next
step; its client has gone and hears nothing)."""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable

from serve.events import ErrorEvent, GenerationRequest
from serve.metrics import ServerMetrics
from serve.sequence import Sequence


class QueueFull(RuntimeError):
    pass


class EngineStopped(RuntimeError):
    pass


class Scheduler:
    def __init__(self, max_batch_size: int, max_queue: int, request_timeout_s: float, metrics: ServerMetrics,
                 running: Callable[[], int]):
        """`running()`: how many rows the batch holds now."""
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.request_timeout_s = request_timeout_s
        self.metrics = metrics
        self.running = running
        self.waiting: collections.deque[GenerationRequest] = collections.deque()
        self.wakeup = threading.Condition()
        self.closed = False

    def open(self) -> None:
        """Take submissions (again: an app's lifespan can run more than once, and each run starts the engine)."""
        with self.wakeup:
            self.closed = False

    def close(self) -> None:
        """Refuse later submissions; what was submitted still runs."""
        with self.wakeup:
            self.closed = True
            self.wakeup.notify()

    def submit(self, request: GenerationRequest) -> None:
        with self.wakeup:
            if self.closed:
                raise EngineStopped("the server is shutting down")
            free_rows = self.max_batch_size - self.running()
            if len(self.waiting) >= self.max_queue + free_rows:
                raise QueueFull(f"{len(self.waiting)} requests are already waiting (limit {self.max_queue} "
                                f"beyond a full batch of {self.max_batch_size})")
            self.waiting.append(request)
            self.metrics.queue_depth.set(len(self.waiting))
            self.wakeup.notify()

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    def next_joining(self) -> list[GenerationRequest] | None:
        """The waiting requests that take the free rows, in order of arrival, once there is work (an empty list
        while only the batch has some); None once closed with nothing left to run."""
        with self.wakeup:
            while not self.waiting and not self.running() and not self.closed:
                self.wakeup.wait()
            if self.closed and not self.waiting and not self.running():
                return None
            joining = [self.waiting.popleft()
                       for _ in range(min(len(self.waiting), self.max_batch_size - self.running()))]
            self.metrics.queue_depth.set(len(self.waiting))
        self._expire_waiting()
        return [request for request in joining if self.admits(request)]

    def admits(self, request: GenerationRequest) -> bool:
        """Whether a request still runs: not cancelled, and within its time (else it is told so)."""
        if request.cancelled:
            return False
        if time.perf_counter() - request.arrival > self.request_timeout_s:
            self._time_out(request, generated=0)
            return False
        return True

    def expire_running(self, active: list[Sequence]) -> None:
        """Mark the rows past their time limit failed, telling their clients; the runner frees them."""
        now = time.perf_counter()
        for seq in active:
            if not seq.done and not seq.request.cancelled and now - seq.request.arrival > self.request_timeout_s:
                self._time_out(seq.request, seq.row.generated)
                seq.failed = True

    def _expire_waiting(self) -> None:
        now = time.perf_counter()
        with self.wakeup:
            expired = [r for r in self.waiting if r.cancelled or now - r.arrival > self.request_timeout_s]
            for request in expired:
                self.waiting.remove(request)
            self.metrics.queue_depth.set(len(self.waiting))
        for request in expired:
            if not request.cancelled:
                self._time_out(request, generated=0)

    def _time_out(self, request: GenerationRequest, generated: int) -> None:
        request.on_event(ErrorEvent("timeout", f"the request exceeded the time limit of {self.request_timeout_s:g}s "
                                               f"after {generated} of {request.params.max_new_tokens} tokens; "
                                               f"ask for fewer tokens or retry when the server is less busy"))
