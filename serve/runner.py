"""Runs the batch: prefills the joining requests (those of one prompt length together: serve/prefill.py), steps every
row together (plain or speculative), samples, hands each row its tokens (decode/row_state.py decides when it
ends), sends the events, and frees the rows that end.

Every row sits in the KV cache from column 0 at its own length (serve/slots.py), and each shared step runs through
the model's DecodeSteps (decode/steps.py), the step runner generate() uses: under `auto` one traced graph on
the CPU (rows at different lengths are written and masked at their own columns inside it) and one captured CUDA
graph on a GPU, either made per row count, so the batch is padded to one of a few counts; eager steps with
`decode="dynamic"` or `"static"`.

With a draft model every step is speculative (decode/speculative.py): the draft proposes K tokens for every row
together, the model checks them in one pass, and each row keeps as many as its own sampling accepts, plus one.  K
is cut for every row when one nears the end of the context, so a seeded request's tokens then depend on its
neighbours (each still follows the model's distribution).

Plain steps may be launched ahead (`async_steps`; by default on a GPU, `launches_ahead`): a step's pass is queued
before the tokens of the step before are read back (serve/sampled_step.py), so the host's work on them runs while
the device computes.  Each row's sampled token stays on the device, written into its slot, as the next step's
input; the step's own tokens are sampled only after the step before's were accepted, so sampling (penalties
included) sees every token as it would otherwise, and a row that ended then leaves after this step, its extra
token never delivered.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from decode.steps import DecodeSteps
from decode.row_state import TokenLogprob
from decode.prefix_cache import PrefixCache, model_identity
from decode.speculative import SpeculativeStats, check_draft, speculative_step
from serve.events import REQUEST_FAILED, ErrorEvent, GenerationRequest
from serve.metrics import ServerMetrics
from serve.prefill import prefill
from serve.sampled_step import SampledStep, sample_sequences, sample_step
from serve.sequence import Sequence
from serve.slots import Slots, padded_rows

log = logging.getLogger("serve.engine")

# How often the log gets a line of the draft's acceptance while requests decode speculatively.
SPECULATIVE_LOG_INTERVAL_S = 30.0


# The most rows of one length a traced step runs in the aligned form (`Runner._aligned`): beyond it, the mask of
# the ragged form costs too little of a step to be worth a trace per row count at start-up.
ALIGNED_ROWS = 4

# Whether each plain step is launched before the tokens of the step before are read back (`launches_ahead`).
ASYNC_STEPS = ("auto", "on", "off")


def launches_ahead(async_steps: str, device: torch.device, speculative: bool) -> bool:
    """Whether a runner launches each plain step before it reads back and hands over the tokens the step before
    sampled (`async_steps`, ASYNC_STEPS), as vLLM's asynchronous scheduling does.

    auto: on a GPU, whose kernels run while the engine's thread goes on, so the thread's work between steps (the
    read-back, each row's bookkeeping and stop strings, the events) overlaps the next step; not on the CPU, where a
    step runs in the thread that launches it, so nothing would overlap and the pass a row runs after its end would
    be work thrown away.  `on` runs the same code on the CPU (the tests' way to check it there).  Never with a draft:
    how many tokens each row keeps from a speculative step decides its next input, on the host."""
    if async_steps not in ASYNC_STEPS:
        raise ValueError(f"async_steps {async_steps!r} is not one of {ASYNC_STEPS}")
    if async_steps == "on" and speculative:
        raise ValueError("steps launched ahead are plain steps; speculative ones (with a draft) read each row's "
                         "kept tokens before the next: leave async_steps at auto or off with a draft")
    return async_steps == "on" or async_steps == "auto" and device.type == "cuda" and not speculative


class Runner:
    def __init__(self, model: torch.nn.Module, device: torch.device, max_batch_size: int, metrics: ServerMetrics,
                 decode: str, draft: torch.nn.Module | None, draft_tokens: int, prefix_cache_bytes: int = 0,
                 async_steps: str = "auto"):
        """`prefix_cache_bytes`: the prefix cache's budget (decode/prefix_cache.py); 0, none.  `async_steps`:
        whether plain steps are launched ahead (`launches_ahead`)."""
        # With a draft, each model's passes as generate() runs them; the weights stay as loaded while they serve.
        speculative = draft is not None
        self.steps = DecodeSteps(model, device, decode, max_batch_size, speculative)
        self.draft_steps = DecodeSteps(draft, device, decode, max_batch_size, speculative) if speculative else None
        self.all_steps = [self.steps] if self.draft_steps is None else [self.steps, self.draft_steps]
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
        self.metrics = metrics
        # A request's prompt and new tokens fit the served model's context.
        self.slots = Slots([steps.new_cache(max_batch_size, model.config.block_size) for steps in self.all_steps])
        self.active: list[Sequence] = []  # active[i] lives in slot row i
        self.prefix_cache = PrefixCache(prefix_cache_bytes, model_identity(model)) if prefix_cache_bytes else None
        self.launch_ahead = launches_ahead(async_steps, device, speculative)
        self.in_flight: SampledStep | None = None  # launching ahead: the last step's tokens, not yet read back

    def join_together(self, requests: list[GenerationRequest]) -> None:
        """Prefill the prompts in one pass (a group of serve/prefill.py's `prefill_groups`: one length; or one
        request), sample each one's first token, and give each sequence that goes on a row."""
        now = time.perf_counter()
        seqs = [Sequence(request, self.device, now, speculative=self.draft is not None) for request in requests]
        prompt = torch.tensor([request.prompt_ids for request in requests], dtype=torch.long, device=self.device)
        prefills = [steps.new_cache(len(requests), prompt.size(1)) for steps in self.all_steps]
        # With echo the prompt's own positions are scored too: logits at every position, not just the last.
        scored = len(requests) == 1 and seqs[0].row.logprobs is not None and requests[0].echo
        logits = prefill(self.steps, self.prefix_cache, self.metrics, prefills[0], requests, prompt, scored)
        if scored:
            seqs[0].row.score_prompt(requests[0].prompt_ids, logits[0])
        going = [row for row, seq in enumerate(seqs) if not seq.row.finished]
        for row, seq in enumerate(seqs):
            if seq.row.finished:  # no new tokens asked for: scoring only (echo), its answer ready as it starts
                seq.first_token_at = seq.started
                self._finish(seq, time.perf_counter())
        if not going:
            return
        sampled, failed = sample_sequences(logits[going, -1], [seqs[row] for row in going])
        tokens = sampled.tolist()
        if self.draft_steps is not None:
            self.draft_steps.logits(prefills[1], prompt, 1)
        for i, row in enumerate(going):
            seq = seqs[row]
            if i in failed:
                self.fail(seq)
                continue
            try:
                self._accept(seq, tokens[i], logits[row, -1])
            except Exception:  # a failure in one request's first token ends that request alone
                log.exception("request failed while handling its first token %d", tokens[i])
                self.fail(seq)
            if seq.done:
                continue
            self.slots.add(prefills, requests[row].prompt_ids + [tokens[i]], row)
            self.active.append(seq)

    def step(self) -> None:
        """Every row gains its next token, or with a draft its kept draft tokens and one of the model's.

        Launching ahead (`launch_ahead`), the step's pass is launched before the tokens the step before sampled
        are read back and handed over; the host does that while the device computes, and the rows that ended
        there are freed after this step (one step late), the token this step sampled for them never read."""
        if self.draft is not None:
            self._speculative_step()
            return
        logits = self._forward()
        earlier, self.in_flight = self.in_flight, None
        if earlier is not None:  # launching ahead: the step before's tokens, while this one computes
            self._deliver(earlier)
        # Sampled after the step before's tokens were accepted: each row's penalties count all its tokens, and a
        # row that ended there gains a token that is never read (it leaves below).
        sampled = sample_step(logits, self.active)
        self.slots.extend_each(sampled.tokens)  # each row's next input, on the device
        if self.launch_ahead:
            self.in_flight = sampled
        else:
            self._deliver(sampled)
        self.end_where(lambda s: s.done)

    def _forward(self) -> torch.Tensor:
        """The running batch's pass over each row's last token, launched: its logits (rows, 1, vocab)."""
        active = len(self.active)
        rows = padded_rows(active, self.max_batch_size) if self.steps.compiled else active
        (cache,), tokens, lengths = self.slots.views(rows)
        if rows > 1 and self.steps.compiled:
            # Several rows run in the ragged form (each at its own columns, through a mask), exact for rows of one
            # length too: then the one trace per row count that warm_up makes serves every batch.  But a traced
            # step of a few rows of one length (the prompts of one request, prefilled together) runs aligned, as
            # generate() runs it: its writes and attention need no mask, a share of a small batch's step
            # (`python -m bench.standalone.joining_batch`, bench/results/joining_batch.json); warm_up traces that
            # form too (`ALIGNED_ROWS`).
            cache.aligned = self._aligned(rows)
        last = tokens.gather(1, (lengths - 1).clamp(min=0)[:, None])  # each row's last token (a free row's: any)
        logits = self.steps.logits(cache, last, 1)[:active]
        if rows > active:
            self.slots.clear_free_rows()
        self.metrics.decode_batch.observe(active)
        return logits

    def _aligned(self, rows: int) -> bool:
        """Whether a step over `rows` rows runs in the aligned form: traced, at most ALIGNED_ROWS rows, none of them
        free padding, each holding as many tokens (read on the host, from the sequences: no step launched ahead)."""
        return (self.steps.mode == "traced" and not self.launch_ahead and rows == len(self.active) <= ALIGNED_ROWS
                and len({len(s.request.prompt_ids) + s.row.generated for s in self.active}) == 1)

    def _deliver(self, sampled: SampledStep) -> None:
        """Each row of `sampled` takes its token, unless its sequence ended or was cancelled since it ran."""
        tokens, scores = sampled.read()
        for row, (seq, token) in enumerate(zip(sampled.seqs, tokens)):
            if seq.done or seq.request.cancelled:  # it left after this step launched: the token is never delivered
                continue
            if row in sampled.failed:
                self.fail(seq)
                continue
            try:
                self._accept(seq, token, None, scores.get(row))
            except Exception:  # a failure in one request's tokens ends that request alone
                log.exception("request failed while handling its token %d", token)
                self.fail(seq)

    def _speculative_step(self) -> None:
        """Each row's kept tokens are accepted in turn as a plain step's token is, so that stop strings,
        end-of-text and max_tokens end a row at the right token."""
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
                    self._accept(seq, token, logits[row, position])
                    if seq.done:
                        break
            except Exception:  # a failure in one request's tokens ends that request alone
                log.exception("request failed while handling its tokens %s", new)
                self.fail(seq)
            step.add(SpeculativeStats(proposed=k, accepted=seq.speculative.accepted - accepted_before, row_steps=1))
            if not seq.done:
                self.slots.extend(row, new)
        self.metrics.speculative_proposed.inc(step.proposed)
        self.metrics.speculative_accepted.inc(step.accepted)
        self.speculative.add(step)
        if time.perf_counter() - self.speculative_logged_at >= SPECULATIVE_LOG_INTERVAL_S:
            log.info("%s", self.speculative.summary())
            self.speculative, self.speculative_logged_at = SpeculativeStats(), time.perf_counter()
        self.end_where(lambda s: s.done)

    def _accept(self, seq: Sequence, token: int, logits: torch.Tensor | None, scored: TokenLogprob | None = None
                ) -> None:
        """`logits` (vocab,): the distribution `token` was drawn from (None when the row keeps no
        log-probabilities, or `scored` brings its entry)."""
        now = time.perf_counter()
        self.metrics.tokens.inc()
        event = seq.accept(token, logits, now, scored)
        if event is not None:
            seq.request.on_event(event)
        if seq.row.finished:
            self._finish(seq, now)

    def _finish(self, seq: Sequence, now: float) -> None:
        reply = seq.reply(now)
        arrival = seq.request.arrival
        self.metrics.queue_time.observe(seq.started - arrival)
        self.metrics.first_token.observe(seq.first_token_at - arrival)
        self.metrics.total_time.observe(now - arrival)
        seq.request.on_event(reply)

    def fail(self, seq: Sequence) -> None:
        """End one sequence with an error that says nothing of the cause (the log has it)."""
        seq.failed = True
        seq.request.on_event(ErrorEvent("internal", REQUEST_FAILED))

    def end_where(self, leaving: Callable[[Sequence], bool]) -> None:
        """Free the rows of the sequences `leaving` picks."""
        # Highest row first: the last row, which fills each gap, is then never one that leaves.
        for row in reversed(range(len(self.active))):
            if leaving(self.active[row]):
                self.slots.remove(row)
                self.active[row] = self.active[-1]
                self.active.pop()
        if not self.active:  # a step launched ahead holds tokens of rows that have all left: never delivered
            self.in_flight = None

    def fail_all(self, message: str) -> None:
        """End every row with `message` (a step that failed for the whole batch)."""
        for seq in self.active:
            if not seq.done and not seq.request.cancelled:
                seq.request.on_event(ErrorEvent("internal", message))
        self.active.clear()
        self.in_flight = None
        while self.slots.rows:
            self.slots.remove(self.slots.rows - 1)
