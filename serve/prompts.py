"""The completions `prompt` in OpenAI's four forms (a text, texts, token ids, lists of token ids) as token ids.

Token ids are what evaluation harnesses send (lm-evaluation-harness's local-completions), so
that the server scores exactly the tokens they chose; each id is checked against the
vocabulary, and an error names its position (`prompt[0][5]`).
"""
from __future__ import annotations

from dataclasses import dataclass

from data.tokenizer import decode, get_tokenizer
from serve.errors import APIError
from serve.schemas import CompletionRequest
from serve.state import ServerState


@dataclass
class Prompt:
    ids: list[int]
    text: str  # what echo returns: the text as sent, or the token ids decoded


def completion_prompts(body: CompletionRequest, state: ServerState) -> list[Prompt]:
    """Every prompt's tokens, or a 422 naming the id outside the vocabulary or the prompt too long for the context."""
    prompts = []
    for p, prompt in enumerate(body.prompts):
        field = "prompt" if body.single_prompt else f"prompt[{p}]"
        if isinstance(prompt, str):
            ids = state.encode_within_context(prompt, body.max_tokens, field, "max_tokens")
            prompts.append(Prompt(ids, prompt))
            continue
        check_vocabulary(prompt, field, state)
        state.check_context(prompt, body.max_tokens, field, "max_tokens")
        prompts.append(Prompt(list(prompt), decode(prompt)))
    return prompts


def check_vocabulary(ids: list[int], field: str, state: ServerState) -> None:
    # The model may have more rows than the tokenizer has tokens (padded) or fewer (a small test model).
    vocab = min(state.vocab_size, get_tokenizer().n_vocab)
    for i, token in enumerate(ids):
        if not 0 <= token < vocab:
            raise APIError(422, f"{field}[{i}]: token id {token} is outside the vocabulary; ids run from 0 to "
                                f"{vocab - 1}", param=f"{field}[{i}]")
