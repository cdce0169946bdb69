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
    out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    scored_prompt = result.prompt_tokens if echo else 0
    end = len(prompt_text) + len(result.text) if result.finish_reason == "stop" else None
    for entries, reader in ((result.logprobs[:scored_prompt], TokenReader(0)),
                            (result.logprobs[scored_prompt:], TokenReader(len(prompt_text)))):
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
    return out


def token_logprobs(entry: TokenLogprob, reader: TokenReader) -> TokenLogprobs:
    """/generate's entry for a generated token that `reader` has not read yet (it reads it): labels as OpenAI's."""
    top = [TokenAlternative(token=token, text=reader.label(token), logprob=logprob) for token, logprob in entry.top]
    label, _, _ = reader.read(entry.token)
    return TokenLogprobs(token=entry.token, text=label, logprob=entry.logprob, top_logprobs=top)


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
