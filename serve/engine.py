"""The engine: owns the model and the running batch, and generates on its own thread.

Continuous batching: a request that arrives is prefilled on its own (one forward pass over
its prompt, batch of one) and then joins the running batch, where every sequence advances
one token per shared forward pass; a sequence leaves the batch the step it finishes, and its
row goes to the next waiting request.  Each request samples with its own torch.Generator,
seeded from its `seed` (model/sampling.py), so its random stream does not depend on its
neighbours in the batch.  Every row sits in the KV cache from column 0 at its own length (serve/slots.py),
and each shared step runs through the model's DecodeSteps (model/decode_steps.py), the step runner generate()
uses: under `auto` one traced graph on the CPU (rows at different lengths are written and masked at their own
columns inside it) and one captured CUDA graph on a GPU, either made per row count, so the batch is padded to
one of a few counts; eager steps with `decode="dynamic"` or `"static"`.

With a draft model every step is speculative (model/speculative.py): the draft proposes K tokens
for every row together, the model checks them in one pass, and each row keeps as many as its
own sampling accepts, plus one.  K is cut for every row when one nears the end of the context, so a
seeded request's tokens then depend on its neighbours (each still follows the model's distribution).

The engine knows nothing about HTTP or asyncio: a request carries an `on_event` callback
that the engine calls, from its thread, with a `TokenEvent` per token and then exactly one
`DoneEvent` or `ErrorEvent` (none once the request was cancelled).
"""
from __future__ import annotations

import collections
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from model.config import EOT_TOKEN
from model.decode_steps import DecodeSteps, cache_dtype
from model.kv_cache import KVCache
from model.sampling import SamplingParams, sample_rows
from model.speculative import DEFAULT_DRAFT_TOKENS, SpeculativeStats, check_draft, speculative_step
from serve.metrics import ServerMetrics
from serve.slots import Slots, padded_rows
from serve.text import TextAssembler

log = logging.getLogger("serve.engine")

# What a client hears when its generation fails: the cause (exception text, internals) goes to the log only.
REQUEST_FAILED = "generation failed for this request; the server log has the details"
# How often the log gets a line of the draft's acceptance while requests decode speculatively.
SPECULATIVE_LOG_INTERVAL_S = 30.0


class QueueFull(RuntimeError):
    pass


class EngineStopped(RuntimeError):
    pass


@dataclass
class TokenEvent:
    token: int
    text: str  # newly releasable text; may be empty while a character or a stop string is incomplete


@dataclass
class Latency:
    queue_ms: float
    time_to_first_token_ms: float
    total_ms: float
    tokens_per_s: float  # generated tokens over the total time the client waited


@dataclass
class TokenLogprob:
    """One position's log-probability under the model (temperature 1, no top-k/top-p) and its best alternatives."""
    token: int
    logprob: float | None  # None for a prompt's first token, which nothing predicts
    top: list[tuple[int, float]]  # the `logprobs` most likely tokens, best first


@dataclass
class DoneEvent:
    text: str  # the whole generated text
    tail: str  # text not yet sent in a TokenEvent
    tokens: int  # generated tokens, end-of-text included
    prompt_tokens: int
    finish_reason: str  # "eos" (end-of-text), "stop" (a stop string) or "length"
    latency: Latency
    logprobs: list[TokenLogprob] | None = None  # the prompt's (with echo), then the generated tokens'
    speculative: SpeculativeStats | None = None  # this request's draft tokens, with a draft model


@dataclass
class ErrorEvent:
    kind: str  # "timeout" or "internal"
    message: str


Event = TokenEvent | DoneEvent | ErrorEvent


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    params: SamplingParams
    on_event: Callable[[Event], None]
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None  # alternatives per position to report; None reports no log-probabilities
    echo: bool = False  # also score the prompt's own tokens
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: bool = False

    def cancel(self) -> None:
        """Stop generating for this request (its client went away); its row is freed at the next step."""
        self.cancelled = True


class _Sequence:
    """A request in the running batch."""

    def __init__(self, request: GenerationRequest, device, started: float):
        self.request = request
        self.params = request.params
        seed = request.params.seed if request.params.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.text = TextAssembler(request.stop)
        self.started = started
        self.first_token_at: float | None = None
        self.generated = 0
        self.finished = False
        self.logprobs: list[TokenLogprob] | None = None if request.logprobs is None else []
        self.speculative = SpeculativeStats()

    def record_logprobs(self, logits: torch.Tensor, tokens: list[int]) -> None:
        """Log-probabilities of `tokens`, each under the row of `logits` (positions, vocab) that predicts it."""
        if self.logprobs is None:
            return
        logp = torch.log_softmax(logits.float(), dim=-1)
        k = self.request.logprobs
        top_values, top_ids = logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long())
        chosen = logp.gather(1, torch.tensor(tokens, device=logp.device)[:, None]).squeeze(1).tolist()
        for i, token in enumerate(tokens):
            self.logprobs.append(TokenLogprob(token, chosen[i], list(zip(top_ids[i].tolist(), top_values[i].tolist()))))


class Engine:
    def __init__(self, model: torch.nn.Module, device: torch.device, max_batch_size: int, max_queue: int,
                 request_timeout_s: float, metrics: ServerMetrics | None = None, decode: str = "auto",
                 draft: torch.nn.Module | None = None, draft_tokens: int = DEFAULT_DRAFT_TOKENS):
        # With a draft, each model's passes as generate() runs them; the weights stay as loaded while they serve.
        speculative = draft is not None
        self.steps = DecodeSteps(model, device, decode, max_batch_size, speculative)
        self.draft_steps = DecodeSteps(draft, device, decode, max_batch_size, speculative) if speculative else None
        self.decode = self.steps.mode
        self.model = model.eval()
        self.config = model.config
        self.draft = draft.eval() if draft is not None else None
        self.draft_tokens = draft_tokens
        if draft is not None:  # any request the model takes must fit the draft's context too
            check_draft(model, draft, model.config.block_size, draft_tokens)
        self.speculative = SpeculativeStats()  # since the last log line
        self.speculative_logged_at = time.perf_counter()
        self.device = device
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.request_timeout_s = request_timeout_s
        self.metrics = metrics or ServerMetrics()
        self.dtype = cache_dtype(model)
        # A request's prompt and new tokens fit the served model's context.
        self.slots = Slots([steps.new_cache(max_batch_size, model.config.block_size) for steps in self._all_steps()])
        self.active: list[_Sequence] = []  # active[i] lives in slot row i
        self.waiting: collections.deque[GenerationRequest] = collections.deque()
        self.wakeup = threading.Condition()
        self.stopping = False
        self.thread: threading.Thread | None = None

    # ---- called from other threads ----

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Before the engine starts: make the one-row steps now (traces or captures, a pause with their first runs)
        rather than in the first request's time, so that a model that cannot be
        traced or captured fails at startup: the plain step, or the speculative check of K + 1 tokens and the
        draft's one-token step.  They run on free row 0 of the empty caches, which a joining sequence overwrites."""
        widths = [1] if self.draft is None else [self.draft_tokens + 1, 1]
        caches, _, _ = self.slots.views(1)
        for steps, cache, width in zip(self._all_steps(), caches, widths):
            steps.prepare(cache, width)
        self.slots.clear_free_rows()

    def _all_steps(self) -> list[DecodeSteps]:
        """The served model's steps, then the draft's: in the order of the slots' caches."""
        return [self.steps] if self.draft_steps is None else [self.steps, self.draft_steps]

    def start(self) -> None:
        """Start the engine's thread, or start it again after `stop`: an app's lifespan can run more than once (a
        test client entered again), and each run starts and stops the engine."""
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="serve-engine", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Finish everything submitted so far, then end the thread; later submissions are refused."""
        with self.wakeup:
            self.stopping = True
            self.wakeup.notify()
        if self.thread is not None:
            self.thread.join()

    def submit(self, request: GenerationRequest) -> None:
        with self.wakeup:
            if self.stopping:
                raise EngineStopped("the server is shutting down")
            free_rows = self.max_batch_size - len(self.active)
            if len(self.waiting) >= self.max_queue + free_rows:
                raise QueueFull(f"{len(self.waiting)} requests are already waiting (limit {self.max_queue} "
                                f"beyond a full batch of {self.max_batch_size})")
            self.waiting.append(request)
            self.metrics.queue_depth.set(len(self.waiting))
            self.wakeup.notify()

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    @property
    def batch_size(self) -> int:
        return len(self.active)

    # ---- the engine thread ----

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self.wakeup:
                    while not self.waiting and not self.active and not self.stopping:
                        self.wakeup.wait()
                    if self.stopping and not self.waiting and not self.active:
                        return
                    joining = [self.waiting.popleft()
                               for _ in range(min(len(self.waiting), self.max_batch_size - len(self.active)))]
                    self.metrics.queue_depth.set(len(self.waiting))
                self._drop_expired_waiting()
                for request in joining:
                    try:
                        self._join(request)
                    except Exception:  # one bad request must not take the server down
                        log.exception("prefill failed")
                        request.on_event(ErrorEvent("internal", REQUEST_FAILED))
                try:
                    self._drop_cancelled_and_expired()
                    if self.active:
                        self._decode_step()
                except Exception:  # one bad step must not take the server down
                    log.exception("generation step failed; failing the %d requests in the batch", len(self.active))
                    self._fail_all("generation failed for every request in the batch; the server log has the details")
                self.metrics.batch_size.set(len(self.active))

    def _join(self, request: GenerationRequest) -> None:
        """Prefill the prompt alone, sample the first token, and give the sequence a row."""
        now = time.perf_counter()
        if request.cancelled:
            return
        if now - request.arrival > self.request_timeout_s:
            self._timeout(request, generated=0)
            return
        seq = _Sequence(request, self.device, started=now)
        prompt_len = len(request.prompt_ids)
        prefill = KVCache.allocate(self.config, 1, prompt_len, self.device, self.dtype)
        idx = torch.tensor([request.prompt_ids], dtype=torch.long, device=self.device)
        # With echo the prompt's own positions are scored too: logits at every position, not just the last.
        logits, _ = self.model(idx, cache=prefill, last_only=not (request.echo and seq.logprobs is not None))
        if request.echo and seq.logprobs is not None:
            seq.logprobs.append(TokenLogprob(request.prompt_ids[0], None, []))
            seq.record_logprobs(logits[0, :-1], request.prompt_ids[1:])
        if seq.params.max_new_tokens == 0:  # scoring only (echo)
            seq.first_token_at = now
            self._finish(seq, "length", time.perf_counter())
            return
        [token] = self._sample(logits[:, -1], [seq])
        if token is None:
            self._fail(seq)
            return
        self._accept(seq, token, logits[:, -1])
        if seq.finished:
            return
        prefills = [prefill]
        if self.draft is not None:
            prefills.append(KVCache.allocate(self.draft.config, 1, prompt_len, self.device, cache_dtype(self.draft)))
            self.draft(idx, cache=prefills[1], last_only=True)
        self.slots.add(prefills, request.prompt_ids + [token])
        self.active.append(seq)

    def _decode_step(self) -> None:
        if self.draft is not None:
            self._speculative_step()
            return
        active = len(self.active)
        rows = padded_rows(active, self.max_batch_size) if self.steps.compiled else active
        (cache,), tokens, lengths = self.slots.views(rows)
        last = tokens.gather(1, (lengths - 1).clamp(min=0)[:, None])  # each row's last token (a free row's: any)
        logits = self.steps.logits(cache, last, 1)[:active]
        self.slots.clear_free_rows()
        self.metrics.decode_batch.observe(active)
        tokens = self._sample(logits[:, -1], self.active)
        for row, (seq, token) in enumerate(zip(self.active, tokens)):
            if token is None:
                self._fail(seq)
                continue
            try:
                self._accept(seq, token, logits[row:row + 1, -1])
            except Exception:  # a failure in one request's tokens ends that request alone
                log.exception("request failed while handling its token %d", token)
                self._fail(seq)
            if not seq.finished:
                self.slots.extend(row, [token])
        self._remove(lambda s: s.finished)

    def _speculative_step(self) -> None:
        """Every row gains its kept draft tokens and one of the model's, each accepted in turn as a plain step's
        token is, so that stop strings, end-of-text and max_tokens end a row at the right token."""
        (target_cache, draft_cache), tokens, lengths = self.slots.views()
        # No position beyond the context: a row holds fewer tokens than that while it generates.
        k = min(self.draft_tokens, self.config.block_size - int(lengths.max()))
        proposals, kept, next_token, logits = speculative_step(
            self.steps, self.draft_steps, target_cache, draft_cache, tokens, lengths, k,
            [s.params for s in self.active], [s.generator for s in self.active])
        self.metrics.decode_batch.observe(len(self.active))
        self.metrics.speculative_passes.inc()
        step = SpeculativeStats(target_passes=1)
        for row, seq in enumerate(self.active):
            n_kept = int(kept[row])
            new = proposals[row, :n_kept].tolist() + [int(next_token[row])]
            # Counted before the tokens are accepted, so that the reply sent as the row ends holds this step too;
            # proposals kept beyond the token that ends a row never reach it and count as not accepted.
            accepted_before = seq.speculative.accepted
            seq.speculative.add(SpeculativeStats(proposed=k, row_steps=1))
            try:
                for position, token in enumerate(new):
                    seq.speculative.accepted += position < n_kept
                    self._accept(seq, token, logits[row, position:position + 1])
                    if seq.finished:
                        break
            except Exception:  # a failure in one request's tokens ends that request alone
                log.exception("request failed while handling its tokens %s", new)
                self._fail(seq)
            step.add(SpeculativeStats(proposed=k, accepted=seq.speculative.accepted - accepted_before, row_steps=1))
            if not seq.finished:
                self.slots.extend(row, new)
        self.metrics.speculative_proposed.inc(step.proposed)
        self.metrics.speculative_accepted.inc(step.accepted)
        self.speculative.add(step)
        if time.perf_counter() - self.speculative_logged_at >= SPECULATIVE_LOG_INTERVAL_S:
            log.info("%s", self.speculative.summary())
            self.speculative, self.speculative_logged_at = SpeculativeStats(), time.perf_counter()
        self._remove(lambda s: s.finished)

    def _sample(self, logits: torch.Tensor, seqs: list[_Sequence]) -> list[int | None]:
        """One token per sequence, sampled together; None for a sequence whose sampling failed (logged).

        When the batch fails, each row is sampled again alone from its generator's state before the
        batch: a row's token depends only on its own logits, settings and generator, so the rows that
        succeed get the token they would have got in the batch.
        """
        generators = [seq.generator for seq in seqs]
        states = [g.get_state() for g in generators]
        try:
            return sample_rows(logits, [seq.params for seq in seqs], generators)
        except Exception:  # find the rows that fail, so that only they end
            log.exception("sampling a batch of %d failed; sampling its rows one at a time", len(seqs))
        tokens: list[int | None] = []
        for row, (seq, state) in enumerate(zip(seqs, states)):
            seq.generator.set_state(state)
            try:
                tokens.append(sample_rows(logits[row:row + 1], [seq.params], [seq.generator])[0])
            except Exception:  # this request alone ends
                log.exception("sampling failed for a request with %s", seq.params)
                tokens.append(None)
        return tokens

    def _fail(self, seq: _Sequence) -> None:
        """End one sequence with an error that says nothing of the cause (the log has it)."""
        seq.finished = True
        seq.request.on_event(ErrorEvent("internal", REQUEST_FAILED))

    def _accept(self, seq: _Sequence, token: int, logits: torch.Tensor) -> None:
        """`logits` (1, vocab): the distribution `token` was drawn from."""
        now = time.perf_counter()
        if seq.first_token_at is None:
            seq.first_token_at = now
        seq.generated += 1
        self.metrics.tokens.inc()
        # End-of-text is scored too, as OpenAI lists it: a harness that drops the last entry (the generated
        # token) would otherwise drop a prompt token's.
        seq.record_logprobs(logits, [token])
        if token == EOT_TOKEN and seq.params.stop_at_eot:
            self._finish(seq, "eos", now)
            return
        delta = seq.text.add(token)
        seq.request.on_event(TokenEvent(token, delta))
        if seq.text.stopped:
            self._finish(seq, "stop", now)
        elif seq.generated >= seq.params.max_new_tokens:
            self._finish(seq, "length", now)

    def _finish(self, seq: _Sequence, reason: str, now: float) -> None:
        seq.finished = True
        tail = seq.text.finish()
        arrival = seq.request.arrival
        total = now - arrival
        latency = Latency(queue_ms=1000 * (seq.started - arrival),
                          time_to_first_token_ms=1000 * (seq.first_token_at - arrival),
                          total_ms=1000 * total, tokens_per_s=seq.generated / total if total > 0 else 0.0)
        self.metrics.queue_time.observe(seq.started - arrival)
        self.metrics.first_token.observe(seq.first_token_at - arrival)
        self.metrics.total_time.observe(total)
        seq.request.on_event(DoneEvent(text=seq.text.text, tail=tail, tokens=seq.generated,
                                       prompt_tokens=len(seq.request.prompt_ids), finish_reason=reason,
                                       latency=latency, logprobs=seq.logprobs,
                                       # a copy: what the reply says as the request ends
                                       speculative=replace(seq.speculative) if self.draft is not None
                                       else None))

    def _timeout(self, request: GenerationRequest, generated: int) -> None:
        request.on_event(ErrorEvent("timeout", f"the request exceeded the time limit of {self.request_timeout_s:g}s "
                                               f"after {generated} of {request.params.max_new_tokens} tokens; "
                                               f"ask for fewer tokens or retry when the server is less busy"))

    def _drop_expired_waiting(self) -> None:
        now = time.perf_counter()
        with self.wakeup:
            expired = [r for r in self.waiting if r.cancelled or now - r.arrival > self.request_timeout_s]
            for request in expired:
                self.waiting.remove(request)
        for request in expired:
            if not request.cancelled:
                self._timeout(request, generated=0)

    def _drop_cancelled_and_expired(self) -> None:
        now = time.perf_counter()
        for seq in self.active:
            if not seq.request.cancelled and now - seq.request.arrival > self.request_timeout_s:
                self._timeout(seq.request, seq.generated)
                seq.finished = True
        self._remove(lambda s: s.finished or s.request.cancelled)

    def _remove(self, leaving: Callable[[_Sequence], bool]) -> None:
        # Highest row first: the last row, which fills each gap, is then never one that leaves.
        for row in reversed(range(len(self.active))):
            if leaving(self.active[row]):
                self.slots.remove(row)
                self.active[row] = self.active[-1]
                self.active.pop()

    def _fail_all(self, message: str) -> None:
        for seq in self.active:
            if not seq.finished and not seq.request.cancelled:
                seq.request.on_event(ErrorEvent("internal", message))
        self.active.clear()
        while self.slots.rows:
            self.slots.remove(self.slots.rows - 1)
