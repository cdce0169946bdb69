"""The engine: owns the model and the running batch, and generates on its own thread.

Continuous batching: a request that arrives is prefilled (one forward pass over its prompt, together with the
prompts of the same length that arrived with it) and then joins the running batch, where every sequence advances
one token per shared forward pass; a sequence leaves the batch the step it finishes, and its row goes to the next
waiting request.  Each request samples with its own torch.Generator, seeded from its `seed` (decode/sampling.py), so
its random stream does not depend on its neighbours in the batch.

The engine's loop joins two parts, as vLLM splits them: the scheduler (serve/scheduler.py) decides what runs next
(the queue, admission, timeouts, cancellation), and the runner (serve/runner.py) runs it (prefill, steps,
sampling, the events).  The engine knows nothing about HTTP or asyncio: a request carries an `on_event` callback
that the engine calls, from its thread, with the events of serve/events.py, and after each prefill and each step
the engine flushes its `delivery` (serve/delivery.py), where the HTTP side's callbacks leave their events, so that
an event loop is woken at most once per pass, and for tokens at most once per stream interval, rather than once
per event.
"""
from __future__ import annotations

import logging
import threading

import torch

from decode.speculative import DEFAULT_DRAFT_TOKENS
from runtime.errors import UserError
from serve.delivery import Delivery
from serve.warm_up import warm_up
from serve.events import REQUEST_FAILED, ErrorEvent, GenerationRequest
from serve.metrics import ServerMetrics
from serve.prefill import prefill_groups
from serve.runner import Runner
from serve.scheduler import Scheduler

log = logging.getLogger("serve.engine")


class RequestRejected(UserError, ValueError):
    """A request that cannot run on the served model; the message says what does not fit, `field` where."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def check_fits(request: GenerationRequest, block_size: int, vocab_size: int) -> None:
    """The prompt holds ids within the model's vocabulary, it and the new tokens fit the context, and the biased
    tokens have logits."""
    ids, new = request.prompt_ids, request.params.max_new_tokens
    if not ids:
        raise RequestRejected("the prompt holds no tokens; a generation starts from at least one", "prompt")
    if len(ids) + new > block_size:
        raise RequestRejected(f"the prompt's {len(ids)} tokens and {new} new ones exceed the model's context of "
                              f"{block_size}", "prompt")
    for what, tokens in (("prompt", ids), ("logit_bias", [token for token, _ in request.params.logit_bias])):
        if tokens and not (0 <= min(tokens) and max(tokens) < vocab_size):
            raise RequestRejected(f"the {what} names a token id outside the model's vocabulary of {vocab_size}", what)


class Engine:
    def __init__(self, model: torch.nn.Module, device: torch.device, max_batch_size: int, max_queue: int,
                 request_timeout_s: float, metrics: ServerMetrics | None = None, decode: str = "auto",
                 draft: torch.nn.Module | None = None, draft_tokens: int = DEFAULT_DRAFT_TOKENS,
                 prefix_cache_bytes: int = 0, stream_interval_s: float = 0.0, async_steps: str = "auto"):
        """`stream_interval_s`: the least time between two hand-overs of tokens to one event loop
        (serve/delivery.py); 0 hands over each step's as it ends.  `async_steps`: whether each step is launched
        before the step before's tokens are read back (serve/runner.py's `launches_ahead`: auto, on a GPU)."""
        self.metrics = metrics or ServerMetrics()
        self.runner = Runner(model, device, max_batch_size, self.metrics, decode, draft, draft_tokens,
                             prefix_cache_bytes, async_steps)
        self.scheduler = Scheduler(max_batch_size, max_queue, request_timeout_s, self.metrics,
                                   running=lambda: len(self.runner.active))
        self.config = model.config
        self.decode = self.runner.steps.mode
        self.delivery = Delivery(stream_interval_s)  # flushed on the engine's thread around prefills, after steps
        self.thread: threading.Thread | None = None

    # ---- called from other threads ----

    @torch.inference_mode()
    def warm_up(self, all_rows: bool = True) -> None:
        warm_up(self.runner, all_rows)

    def start(self, warm_up_all_rows: bool | None = None) -> None:
        """Start the engine's thread, or start it again after `stop`: an app's lifespan can run more than once (a
        test client entered again), and each run starts and stops the engine.

        With `warm_up_all_rows` (not None), the thread first warms up (serve/warm_up.py, every row count's step or the
        one-row step alone), and this returns once it has, raising what made the warm-up fail.  On the engine's own
        thread, because part of what a first request pays is the thread's: its OpenMP team and the per-thread state
        of the kernels it runs (a warm-up on another thread left the first request slower than the next:
        `python -m bench.experiments first_request`, bench/results/first_request.json)."""
        self.scheduler.open()
        warmed: list[BaseException | None] = []
        ready = threading.Event()

        def run() -> None:
            if warm_up_all_rows is not None:
                try:
                    self.warm_up(warm_up_all_rows)
                except BaseException as e:  # handed to start(), which raises it
                    warmed.append(e)
                    ready.set()
                    return
            warmed.append(None)
            ready.set()
            self._run()

        self.thread = threading.Thread(target=run, name="serve-engine", daemon=True)
        self.thread.start()
        ready.wait()
        if warmed[0] is not None:
            self.thread.join()
            raise warmed[0]

    def stop(self) -> None:
        """Finish everything submitted so far, then end the thread; later submissions are refused."""
        self.scheduler.close()
        if self.thread is not None:
            self.thread.join()

    def submit(self, request: GenerationRequest) -> None:
        """Check that `request` can run on this engine's model, then queue it; raises RequestRejected (naming what
        does not fit), QueueFull or EngineStopped (serve/scheduler.py).  The routes check the same with the
        request's own field names first; this is the engine's guard for every caller, so that a request that
        cannot run fails here, at once, rather than in the engine's thread, in its prefill or a step."""
        check_fits(request, self.config.block_size, self.config.vocab_size)
        self.scheduler.submit(request)

    @property
    def queue_depth(self) -> int:
        return self.scheduler.queue_depth

    @property
    def batch_size(self) -> int:
        return len(self.runner.active)

    # ---- the engine thread ----

    def _run(self) -> None:
        with torch.inference_mode():
            while (joining := self.scheduler.next_joining()) is not None:
                if joining:  # a prefill is long: no token held for the stream interval waits through it
                    self.delivery.flush(force=True)
                for group in prefill_groups(joining, self.runner.prefix_cache, self.runner.draft is not None):
                    try:
                        self.runner.join_together(group)
                    except Exception:  # one bad request must not take the server down
                        log.exception("prefill failed")
                        for request in group:
                            request.on_event(ErrorEvent("internal", REQUEST_FAILED))
                    # Their first tokens go now, not after the other prefills and the step, nor held for the interval.
                    self.delivery.flush(force=True)
                try:
                    self.scheduler.expire_running(self.runner.active)
                    self.runner.end_where(lambda s: s.done or s.request.cancelled)
                    if self.runner.active:
                        self.runner.step()
                except Exception:  # one bad step must not take the server down
                    log.exception("generation step failed; failing the %d requests in the batch", self.batch_size)
                    self.runner.fail_all("generation failed for every request in the batch; the server log has "
                                         "the details")
                self.delivery.flush()  # a request's end goes now; its tokens at most once per stream interval
                self.metrics.batch_size.set(self.batch_size)
