"""Streamed chunks rendered from templates (serve/completion_chunks.py, serve/logprobs.py) equal what the pydantic
models they replace give: the same JSON object, and the same bytes."""
from __future__ import annotations

import json

import pytest

from data.tokenizer import encode
from decode.row_state import TokenLogprob
from serve.completion_chunks import CompletionChunks
from serve.logprobs import TokenReader, token_logprobs, token_logprobs_fields
from serve.schemas import Completion, CompletionChoice, CompletionLogprobs

ID, CREATED, MODEL = "cmpl-0123abcd", 1764200000, 'gpt2 "124M" \u00e9'
LOGPROBS = CompletionLogprobs(tokens=[" the", "bytes:\\xe2\\x80"], token_logprobs=[-0.25, -3.5],
                              top_logprobs=[{" the": -0.25, " a": -1.75}, {"\u2019": -3.5}], text_offset=[12, 16])


def pydantic_chunk(choice: CompletionChoice) -> str:
    """What the stream sent before the template: the model, dumped."""
    body = Completion(id=ID, choices=[choice], created=CREATED, model=MODEL)
    return f"data: {json.dumps(body.model_dump(exclude_none=True) | {'choices': [choice.model_dump()]})}\n\n"


@pytest.mark.parametrize("text, index, finish_reason, logprobs", [
    (" plain text", 0, None, None),  # a token's text
    ("quote \" backslash \\ newline \n emoji \U0001f600", 3, None, None),
    (" the\u2019", 1, None, LOGPROBS),  # with log-probabilities
    ("", 0, None, CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])),
    ("tail", 2, "stop", None),  # the finish chunk
    ("", 0, "length", LOGPROBS),
    ("prompt", 0, None, CompletionLogprobs(tokens=["prompt"], token_logprobs=[None], top_logprobs=[None],
                                           text_offset=[0])),  # an echoed prompt's first entry
])
def test_completion_chunk_equals_the_models(text, index, finish_reason, logprobs):
    chunks = CompletionChunks(ID, CREATED, MODEL)
    templated = chunks.choice(text, index, finish_reason, logprobs)
    expected = pydantic_chunk(CompletionChoice(text=text, index=index, finish_reason=finish_reason, logprobs=logprobs))
    assert json.loads(templated.removeprefix("data: ")) == json.loads(expected.removeprefix("data: "))
    assert templated == expected


def test_generate_token_logprobs_fields_equal_the_models():
    tokens = encode("Hello, world \u2019s")
    entries = [TokenLogprob(token, -0.5 - i, [(token, -0.5 - i), (tokens[0], -2.0)]) for i, token in enumerate(tokens)]
    model_reader, plain_reader = TokenReader(0), TokenReader(0)
    for entry in entries:
        model = token_logprobs(entry, model_reader)
        assert token_logprobs_fields(entry, plain_reader) == {
            "logprob": model.logprob, "top_logprobs": [a.model_dump() for a in model.top_logprobs]}
    assert plain_reader.offset == model_reader.offset
