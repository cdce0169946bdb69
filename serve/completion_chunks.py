"""A streamed /v1/completions request's chunks, rendered from a template made once per request.

A chunk is OpenAI's completion object with one choice: `Completion(...).model_dump(exclude_none=True)` with the
choice's `model_dump()`, as JSON.  Everything but the choice's text, index, log-probabilities and finish reason is
the same in every chunk of a request, so it is rendered once; each chunk fills in those parts alone, with the same
json.dumps, rather than building and dumping pydantic models per token on the event loop.
"""
from __future__ import annotations

import json

from serve.schemas import CompletionLogprobs


class CompletionChunks:
    def __init__(self, completion_id: str, created: int, model_id: str):
        # The keys in the model's order: id, choices, created, model, object (usage, None here, left out).
        self.head = f'data: {{"id": {json.dumps(completion_id)}, "choices": ['
        self.tail = f'], "created": {json.dumps(created)}, "model": {json.dumps(model_id)}, ' \
                    f'"object": "text_completion"}}\n\n'

    def choice(self, text: str, index: int, finish_reason: str | None = None,
               logprobs: CompletionLogprobs | None = None) -> str:
        """The chunk of one choice's piece of text (CompletionChoice's fields, in its order)."""
        return (f'{self.head}{{"text": {json.dumps(text)}, "index": {json.dumps(index)}, '
                f'"logprobs": {logprobs_json(logprobs)}, "finish_reason": {json.dumps(finish_reason)}}}{self.tail}')


def logprobs_json(logprobs: CompletionLogprobs | None) -> str:
    if logprobs is None:
        return "null"
    return json.dumps({"tokens": logprobs.tokens, "token_logprobs": logprobs.token_logprobs,
                       "top_logprobs": logprobs.top_logprobs, "text_offset": logprobs.text_offset})
