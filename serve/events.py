"""What passes between the HTTP side and the engine: a request for one generation, and the events the engine
sends back for it from its own thread (a TokenEvent per token, then exactly one DoneEvent or ErrorEvent; none once
the request was cancelled)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from decode.row_state import TokenLogprob
from decode.sampling import SamplingParams
from decode.speculative import SpeculativeStats

# What a client hears when its generation fails: the cause (exception text, internals) goes to the log only.
REQUEST_FAILED = "generation failed for this request; the server log has the details"


@dataclass
class TokenEvent:
    token: int
    text: str  # newly releasable text; may be empty while a character or a stop string is incomplete
    logprob: TokenLogprob | None = None  # the token's, when its request asked for log-probabilities
    # On a row's first token event, with echo and log-probabilities: the prompt's entries (a stream sends them
    # with the echoed prompt).
    prompt_logprobs: list[TokenLogprob] | None = None


@dataclass
class Latency:
    queue_ms: float
    time_to_first_token_ms: float
    total_ms: float
    tokens_per_s: float  # generated tokens over the total time the client waited


@dataclass
class DoneEvent:
    text: str  # the whole generated text
    tail: str  # text not yet sent in a TokenEvent
    tokens: int  # generated tokens, end-of-text included
    prompt_tokens: int
    finish_reason: str  # decode/row_state.py's FINISH_REASONS: "eos", "stop" (a stop string) or "length"
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
    # Only requests with the same salt share prefix-cache blocks (decode/prefix_cache.py; serve/state.py derives it)
    cache_salt: bytes = b""
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: bool = False

    def cancel(self) -> None:
        """Stop generating for this request (its client went away); its row is freed at the next step."""
        self.cancelled = True
