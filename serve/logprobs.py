"""OpenAI's completions `logprobs` from the engine's: each token's text and its character offset; and /generate's,
each token with its alternatives.

GPT-2's tokens are byte strings, and a character of several UTF-8 bytes (an emoji, most CJK) is
often split across tokens.  As OpenAI reports such tokens, one that leaves a character unfinished
is shown as its bytes ("bytes:\\xf0\\x9f"), and the one that finishes it as the text it completes,
the whole character included.  Offsets index the choice's text in characters; as OpenAI's do, the
generated tokens' start after the prompt even without echo (vLLM's start at 0 there).  The pieces
of one character share its offset.

With a stop string the entries cover exactly the returned text: a token whose text starts at or after the
stop string is left out, as that text is, and the token that holds the stop string's start and text before it
is kept, shown as that part of its text alone, so that the tokens joined are the text.  Its `token_logprobs`
entry is still the whole token's (what the model chose), and its `top_logprobs` keys are whole tokens.
"""
from __future__ import annotations

import codecs

from data.tokenizer import get_tokenizer
from decode.row_state import TokenLogprob
from serve.events import DoneEvent
from serve.schemas import CompletionLogprobs, TokenAlternative, TokenLogprobs


def completion_logprobs(result: DoneEvent, prompt_text: str, echo: bool) -> CompletionLogprobs:
    """`result.logprobs` start with the prompt's entries when `echo` (then the choice's text starts with `prompt_text`)."""
    out = empty_logprobs()
    scored_prompt = result.prompt_tokens if echo else 0
    end = len(prompt_text) + len(result.text) if result.finish_reason == "stop" else None
    add_entries(out, result.logprobs[:scored_prompt], TokenReader(0))
    add_entries(out, result.logprobs[scored_prompt:], TokenReader(len(prompt_text)), end)
    return out


def empty_logprobs() -> CompletionLogprobs:
    return CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])


def add_entries(out: CompletionLogprobs, entries: list[TokenLogprob], reader: TokenReader,
                end: int | None = None) -> None:
    """Append `entries`, read in order by `reader`, to `out`; with `end` (where a stop string cut the text), none
    whose text starts at or after it, and the one it falls inside cut to its part before it."""
    for entry in entries:
        top = None if entry.logprob is None else {reader.label(token): lp for token, lp in entry.top}
        label, text, offset = reader.read(entry.token)
        if end is not None and offset >= end:
            break
        if end is not None and offset + len(text) > end:  # the stop string starts inside this token
            label = text[:end - offset]
        out.tokens.append(label)
        out.token_logprobs.append(entry.logprob)
        out.top_logprobs.append(top)
        out.text_offset.append(offset)


def logprobs_slice(logprobs: CompletionLogprobs, start: int) -> CompletionLogprobs:
    """The entries from `start` on."""
    return CompletionLogprobs(tokens=logprobs.tokens[start:], token_logprobs=logprobs.token_logprobs[start:],
                              top_logprobs=logprobs.top_logprobs[start:], text_offset=logprobs.text_offset[start:])


class StreamedLogprobs:
    """One streamed choice's log-probabilities, chunk by chunk, as OpenAI and vLLM stream them: each chunk
    carries the entries of the tokens whose text it completes, offsets counting on from the prompt's end (as the
    whole reply's do), so that the chunks' entries joined are exactly the non-streamed reply's.

    A token's entry waits until its text has been released whole: text held back for a stop string may still be
    cut, and the entry with it (completion_logprobs' rule, applied to what is left when the choice ends)."""

    def __init__(self, prompt_text: str):
        self.prompt_text = prompt_text
        self.reader = TokenReader(len(prompt_text))
        self.released_end = len(prompt_text)  # the offset where the text sent so far ends
        self.pending: list[TokenLogprob] = []
        self.sent = 0  # generated tokens' entries sent

    def token(self, entry: TokenLogprob, released: str) -> CompletionLogprobs:
        """The entries a token event completes: `entry` is the token's, `released` the text it let out."""
        self.pending.append(entry)
        self.released_end += len(released)
        out = empty_logprobs()
        while self.pending and self.reader.end_after(self.pending[0].token) <= self.released_end:
            add_entries(out, [self.pending.pop(0)], self.reader)
            self.sent += 1
        return out

    def done(self, result: DoneEvent, echo: bool) -> CompletionLogprobs:
        """The entries not sent yet, the end-of-text that ended the choice and a stop string's cut applied."""
        whole = completion_logprobs(result, self.prompt_text, echo)
        return logprobs_slice(whole, (result.prompt_tokens if echo else 0) + self.sent)


def prompt_logprobs(entries: list[TokenLogprob]) -> CompletionLogprobs:
    """An echoed prompt's entries (offsets from 0)."""
    out = empty_logprobs()
    add_entries(out, entries, TokenReader(0))
    return out


def token_logprobs(entry: TokenLogprob, reader: TokenReader) -> TokenLogprobs:
    """/generate's entry for a generated token that `reader` has not read yet (it reads it): labels as OpenAI's."""
    top = [TokenAlternative(token=token, text=reader.label(token), logprob=logprob) for token, logprob in entry.top]
    label, _, _ = reader.read(entry.token)
    return TokenLogprobs(token=entry.token, text=label, logprob=entry.logprob, top_logprobs=top)


def token_logprobs_fields(entry: TokenLogprob, reader: TokenReader) -> dict:
    """A streamed /generate token event's `logprob` and `top_logprobs`, as `token_logprobs` gives them, in plain
    values: a stream builds no pydantic models per token."""
    top = [{"token": token, "text": reader.label(token), "logprob": logprob} for token, logprob in entry.top]
    reader.read(entry.token)
    return {"logprob": entry.logprob, "top_logprobs": top}


class TokenReader:
    """Decodes tokens in order from a character offset, holding back the bytes of an unfinished character."""

    def __init__(self, offset: int):
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.offset = offset

    def read(self, token: int) -> tuple[str, str, int]:
        """The token's label, its text and the offset of that text; moves past it."""
        offset = self.offset
        label, text = self._decode(token)
        self.offset += len(text)
        return label, text, offset

    def end_after(self, token: int) -> int:
        """The offset where `token`'s text would end if it came next."""
        state = self.decoder.getstate()
        _, text = self._decode(token)
        self.decoder.setstate(state)
        return self.offset + len(text)

    def label(self, token: int) -> str:
        """How `token` would be shown if it came next (an alternative's key in top_logprobs)."""
        state = self.decoder.getstate()
        label, _ = self._decode(token)
        self.decoder.setstate(state)
        return label

    def _decode(self, token: int) -> tuple[str, str]:
        data = get_tokenizer().decode_single_token_bytes(token)
        text = self.decoder.decode(data)
        unfinished = self.decoder.getstate()[0]
        return (as_bytes(data) if unfinished else text), text


def as_bytes(data: bytes) -> str:
    """OpenAI's label for a token that ends inside a character: printable ASCII as itself, other bytes as \\xNN."""
    return "bytes:" + "".join(chr(b) if 0x20 <= b < 0x7f and b != 0x5c else f"\\x{b:02x}" for b in data)
