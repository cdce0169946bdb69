"""serve/prompts.py on its own, without a model: each of OpenAI's four prompt forms becomes the token ids and text it
should, and an id outside the vocabulary (the model's or the tokenizer's, whichever is smaller) or a prompt too long
for the context is a 422 naming its exact position -- so a moved bound or a wrong position fails here at once."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from data.tokenizer import encode, get_tokenizer
from serve.errors import APIError
from serve.prompts import Prompt, check_vocabulary, completion_prompts
from serve.schemas import CompletionRequest
from serve.state import ServerState

TOKENIZER_VOCAB = 50257


def state(vocab_size: int = 100, block_size: int = 16) -> ServerState:
    """The routes' state around a model of this vocabulary and context; nothing else is used here."""
    engine = SimpleNamespace(config=SimpleNamespace(vocab_size=vocab_size, block_size=block_size))
    return ServerState(config=None, engine=engine, metrics=None, checkpoint=None, artifact_kind="float",
                       model_id="tiny", created=0, device=None, api_keys=())


def refusal(call) -> tuple[int, str, str | None]:
    with pytest.raises(APIError) as refused:
        call()
    return refused.value.status, refused.value.message, refused.value.param


def test_the_tokenizer_is_gpt2s():
    assert get_tokenizer().n_vocab == TOKENIZER_VOCAB


@pytest.mark.parametrize("vocab, last", [(100, 99), (1, 0), (TOKENIZER_VOCAB, TOKENIZER_VOCAB - 1),
                                         (TOKENIZER_VOCAB + 47, TOKENIZER_VOCAB - 1)])
def test_ids_run_from_zero_to_the_smaller_vocabulary_and_the_first_outside_is_named(vocab, last):
    check_vocabulary([0, last, 0], "prompt", state(vocab))  # both ends are ids
    for bad, at in [(last + 1, 1), (-1, 2), (-(2**40), 0), (2**63, 3)]:
        ids = [0, 0, 0, 0]
        ids[at] = bad
        assert refusal(lambda: check_vocabulary(ids, "prompt[2]", state(vocab))) == (
            422, f"prompt[2][{at}]: token id {bad} is outside the vocabulary; ids run from 0 to {last}",
            f"prompt[2][{at}]")


def test_only_the_first_id_outside_is_named():
    assert refusal(lambda: check_vocabulary([5, 100, 101, -1], "tokens", state(100)))[2] == "tokens[1]"
    check_vocabulary([], "tokens", state(100))


def completion(prompt, **fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "tiny", "prompt": prompt, **fields})


def test_each_prompt_form_gives_its_ids_and_the_text_echo_returns():
    text = "The quick brown fox"
    ids = encode(text)
    assert completion_prompts(completion(text, max_tokens=2), state(TOKENIZER_VOCAB)) == [Prompt(ids, text)]
    assert completion_prompts(completion(ids, max_tokens=2), state(TOKENIZER_VOCAB)) == [Prompt(ids, text)]
    assert completion_prompts(completion([text, "Hello"], max_tokens=2), state(TOKENIZER_VOCAB)) == [
        Prompt(ids, text), Prompt(encode("Hello"), "Hello")]
    assert completion_prompts(completion([ids, encode("Hi")], max_tokens=2), state(TOKENIZER_VOCAB)) == [
        Prompt(ids, text), Prompt(encode("Hi"), "Hi")]


@pytest.mark.parametrize("prompt, param", [
    ([1, 2, 100], "prompt[2]"), ([[1], [2, 100]], "prompt[1][1]"), ([[100], [2]], "prompt[0][0]")])
def test_an_id_outside_is_named_by_its_place_in_each_form(prompt, param):
    assert refusal(lambda: completion_prompts(completion(prompt, max_tokens=1), state(100)))[2] == param


@pytest.mark.parametrize("prompt, param, length", [
    ("a " * 20, "prompt", len(encode("a " * 20))), (["hi", "a " * 20], "prompt[1]", len(encode("a " * 20))),
    ([1] * 20, "prompt", 20), ([[1], [2] * 20], "prompt[1]", 20)])
def test_a_prompt_longer_than_the_context_is_named_by_its_place_in_each_form(prompt, param, length):
    status, message, named = refusal(lambda: completion_prompts(completion(prompt, max_tokens=1), state(100)))
    assert (status, named) == (422, param)
    assert message.startswith(f"{param} is {length} token(s) and max_tokens is 1: {length + 1} exceeds the model's "
                              f"context of 16 tokens")


def test_the_new_tokens_count_against_the_context_of_each_form():
    for prompt in (list(range(10)), [list(range(10))], "a" * 10):
        count = 10 if not isinstance(prompt, str) else len(encode(prompt))
        completion_prompts(completion(prompt, max_tokens=16 - count), state(100))  # exactly the context
        status, message, param = refusal(lambda: completion_prompts(completion(prompt, max_tokens=17 - count),
                                                                    state(100)))
        assert (status, param) == (422, "max_tokens"), prompt
        assert f"{count + 17 - count} exceeds the model's context of 16 tokens" in message
