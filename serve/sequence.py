"""A request in the running batch: its row's state (decode/row_state.py), its own random generator, and the times
its reply reports."""
from __future__ import annotations

import secrets
from dataclasses import replace

import torch

from decode.row_state import RowState, TokenLogprob
from decode.speculative import SpeculativeStats
from serve.events import DoneEvent, GenerationRequest, Latency, TokenEvent


class Sequence:
    def __init__(self, request: GenerationRequest, device: torch.device, started: float, speculative: bool):
        self.request = request
        self.params = request.params
        # Seeded from the request's own seed, so its draws do not depend on its neighbours in the batch.
        seed = request.params.seed if request.params.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.row = RowState(request.params, request.stop, request.logprobs, releases_text=True)
        self.started = started
        self.first_token_at: float | None = None
        self.failed = False  # ended without a reply of its own: an error or a timeout was sent instead
        self.speculative = SpeculativeStats() if speculative else None

    @property
    def done(self) -> bool:
        return self.row.finished or self.failed

    def accept(self, token: int, logits: torch.Tensor | None, now: float, scored: TokenLogprob | None = None
               ) -> TokenEvent | None:
        """The row takes `token`, drawn from `logits` (vocab,), which only a row keeping log-probabilities needs
        (or with `scored`, its entry worked out already: RowState.accept); the event for the client, if the token
        has one."""
        first = self.row.generated == 0
        if self.first_token_at is None:
            self.first_token_at = now
        released = self.row.accept(token, logits, scored)
        if released is None:
            return None
        if self.row.logprobs is None:
            return TokenEvent(token, released)
        prompt = self.row.logprobs[:len(self.request.prompt_ids)] if first and self.request.echo else None
        return TokenEvent(token, released, self.row.logprobs[-1], prompt)

    def reply(self, now: float) -> DoneEvent:
        """The reply for a row that ended at `now`."""
        arrival = self.request.arrival
        total = now - arrival
        latency = Latency(queue_ms=1000 * (self.started - arrival),
                          time_to_first_token_ms=1000 * (self.first_token_at - arrival),
                          total_ms=1000 * total, tokens_per_s=self.row.generated / total if total > 0 else 0.0)
        tail = self.row.text.finish()
        return DoneEvent(text=self.row.text.text, tail=tail, tokens=self.row.generated,
                         prompt_tokens=len(self.request.prompt_ids), finish_reason=self.row.finish_reason,
                         latency=latency, logprobs=self.row.logprobs,
                         # a copy: what the reply says as the request ends
                         speculative=replace(self.speculative) if self.speculative is not None else None)
