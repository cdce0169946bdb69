"""Turn a growing list of generated tokens into text that is safe to stream.

Two things hold text back: a token can end in the middle of a multi-byte UTF-8 character
(the decoder shows U+FFFD until the rest arrives), and the text can end with the start of a
stop string that the next tokens may complete.  Text released to the client never has to be
taken back, and the final text ends before the first stop string.
"""
from __future__ import annotations

from data.tokenizer import decode

INCOMPLETE_CHAR = "\ufffd"


class TextAssembler:
    def __init__(self, stop: list[str]):
        self.stop = stop
        self.tokens: list[int] = []
        self.released = 0  # characters of the text already handed out
        self.stopped = False
        self.text = ""

    def add(self, token: int) -> str:
        """Append a token; return the newly releasable text.  `stopped` turns True at a stop string."""
        self.tokens.append(token)
        text = decode(self.tokens)
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            self.text = text[: min(hits)]
            return self._release(len(self.text))
        self.text = text
        safe = len(text.rstrip(INCOMPLETE_CHAR))
        held = 0
        for s in self.stop:
            # The longest tail of the text that a stop string starts with stays back.
            for k in range(min(len(s) - 1, safe), held, -1):
                if text[:safe].endswith(s[:k]):
                    held = k
                    break
        return self._release(safe - held)

    def finish(self) -> str:
        """Everything not yet released (the text ended without completing a stop string)."""
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        upto = max(upto, self.released)
        out = self.text[self.released:upto]
        self.released = upto
        return out
