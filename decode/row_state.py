"""One sequence's life while it decodes: the tokens it gains, when it ends and why, and what it reports.

generate(), speculative decoding and the server's engine feed every new token of a row through `RowState.accept`,
so the rules for ending are written once, here:

- end-of-text ends the row (when its settings stop there) and is not part of its output;
- a stop string ends it at the token that completes the string, its text cut before the string;
- `max_new_tokens` ends it at its last token.

A row also keeps its tokens' log-probabilities when asked (the server's `logprobs`), and releases its text as it
grows, holding back what a stop string or an unfinished character could still take back (decode/text.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from model.config import EOT_TOKEN
from decode.sampling import SamplingParams
from decode.text import TextAssembler

# Why a row ended, as the server's /generate reports it; the OpenAI API calls the first two both "stop".
FINISH_REASONS = ("eos", "stop", "length")
OPENAI_FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


@dataclass
class TokenLogprob:
    """One position's log-probability under the model (temperature 1, no top-k/top-p) and its best alternatives."""
    token: int
    logprob: float | None  # None for a prompt's first token, which nothing predicts
    top: list[tuple[int, float]]  # the `logprobs` most likely tokens, best first


class RowState:
    """A row's tokens, its limits and stop strings, its log-probabilities, and why it ended (`finish_reason`,
    None while it goes on)."""

    def __init__(self, params: SamplingParams, stop: Sequence[str] = (), logprobs: int | None = None,
                 releases_text: bool = False):
        """`logprobs`: alternatives to keep per position (None keeps no log-probabilities); `releases_text`: have
        `accept` return the text each token releases (always so with stop strings, which are matched in text)."""
        self.params = params
        self.text = TextAssembler(list(stop)) if stop or releases_text else None
        self.tokens: list[int] = []  # the output: what it generated, less the end-of-text that ended it
        self.generated = 0  # tokens generated, that end-of-text included
        # A row asked for no new tokens (a prompt scored alone) has ended already.
        self.finish_reason: str | None = "length" if params.max_new_tokens == 0 else None
        self.top_logprobs = logprobs
        self.logprobs: list[TokenLogprob] | None = None if logprobs is None else []

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def accept(self, token: int, logits: torch.Tensor | None = None, scored: TokenLogprob | None = None
               ) -> str | None:
        """Take the row's next token, drawn from `logits` (vocab,), which only a row keeping log-probabilities
        needs, unless `scored` brings the token's entry worked out from them already (`logprob_tensors`, as the
        server's steps launched ahead do before the next step overwrites the logits).  Returns the text the token
        releases ("" without `releases_text`), or None for the end-of-text that ends the row.  The token that ends
        the row sets `finish_reason`."""
        if self.finished:
            raise RuntimeError(f"the row already ended ({self.finish_reason}); it takes no more tokens")
        self.generated += 1
        if self.logprobs is not None:
            # End-of-text is scored too, as OpenAI lists it: a harness that drops the last entry (the generated
            # token) would otherwise drop a prompt token's.
            if scored is not None:
                self.logprobs.append(scored)
            else:
                self.record_logprobs(logits[None], [token])
        if token == EOT_TOKEN and self.params.stop_at_eot:
            self.finish_reason = "eos"
            return None
        self.tokens.append(token)
        released = self.text.add(token) if self.text is not None else ""
        if self.text is not None and self.text.stopped:
            self.finish_reason = "stop"
        elif self.generated >= self.params.max_new_tokens:
            self.finish_reason = "length"
        return released

    def accept_all(self, tokens: Iterable[int]) -> int:
        """Take `tokens` in order until the row ends; how many it took."""
        taken = 0
        for token in tokens:
            self.accept(token)
            taken += 1
            if self.finished:
                break
        return taken

    def score_prompt(self, prompt_ids: list[int], logits: torch.Tensor) -> None:
        """Log-probabilities of the prompt's own tokens (echo), from the prompt pass's logits (positions, vocab)."""
        self.logprobs.append(TokenLogprob(prompt_ids[0], None, []))
        self.record_logprobs(logits[:-1], prompt_ids[1:])

    def record_logprobs(self, logits: torch.Tensor, tokens: list[int]) -> None:
        """Log-probabilities of `tokens`, each under the row of `logits` (positions, vocab) that predicts it."""
        self.logprobs += logprob_entries(tokens, *logprob_tensors(logits, torch.tensor(tokens, device=logits.device),
                                                                  self.top_logprobs))


def logprob_tensors(logits: torch.Tensor, tokens: torch.Tensor, top: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """On the logits' device, for `tokens` (positions,), each under the row of `logits` (positions, vocab) that
    predicts it: its log-probability (positions,) and the `top` best tokens' (values and ids, (positions, top))."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top_values, top_ids = logp.topk(top, dim=-1) if top else (logp[:, :0], logp[:, :0].long())
    return logp.gather(1, tokens[:, None]).squeeze(1), top_values, top_ids


def logprob_entries(tokens: list[int], chosen: torch.Tensor, top_values: torch.Tensor, top_ids: torch.Tensor
                    ) -> list[TokenLogprob]:
    """`logprob_tensors`' results, on the host, as one entry per token."""
    chosen_values = chosen.tolist()
    return [TokenLogprob(token, chosen_values[i], list(zip(top_ids[i].tolist(), top_values[i].tolist())))
            for i, token in enumerate(tokens)]
