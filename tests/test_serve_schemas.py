"""serve/schemas.py's request bodies at their bounds, without a server: the documented range of each field, written
here from the API's contract (OpenAI's completions reference, and /generate's own), so a bound changed in the schema
-- a limit moved by one, a `le=` dropped -- fails here in well under a second, before the HTTP suites run."""
from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from serve.schemas import (TOKEN_EVENT_DATA, CompletionRequest, DetokenizeRequest, GenerateRequest, StreamOptions,
                           TokenAlternative, TokenizeRequest)

MAX_SEED = 2**63 - 1  # torch's generator takes a signed 64-bit seed
GENERATE = {"prompt": "Hello"}
COMPLETION = {"model": "tiny", "prompt": "Hello"}

# (field, accepted values, refused values): each range's ends, and the first value past each.
GENERATE_BOUNDS = [
    ("prompt", ["a"], ["", 5, None]),
    ("max_new_tokens", [1, 4096], [0, -1, 1.0, "5", True]),
    ("temperature", [0, 0.0, 1e-5, 10, 10.0], [-1e-9, 10.000001, math.nan, math.inf, "1"]),
    ("top_k", [None, 1, 50257], [0, -1, 1.5]),
    ("top_p", [None, 1e-9, 0.5, 1, 1.0], [0, 0.0, 1.000001, -0.1, math.nan]),
    ("seed", [None, 0, 1, MAX_SEED], [-1, MAX_SEED + 1, 2**64, 1.0, "1"]),
    ("stop", ["x", "x" * 100, [], ["a", "b", "c", "d"]], ["", "x" * 101, ["a", "b", "c", "d", "e"], [""], 5]),
    ("stream", [True, False], [1, "true"]),
    ("ignore_eos", [True, False], [0]),
    ("logprobs", [None, 0, 5], [-1, 6, 2.0]),
    ("logit_bias", [None, {}, {"5": -100}, {"5": 100.0}, {"5": 0}, {str(i): 1 for i in range(300)}],
     [{"5": -100.5}, {"5": 100.001}, {"5": math.nan}, {"5": "1"}, {str(i): 1 for i in range(301)}, [5]]),
    ("presence_penalty", [-2, -2.0, 0, 2.0], [-2.001, 2.001, math.inf, "0"]),
    ("frequency_penalty", [-2, 0, 2], [-2.5, 2.5, math.nan]),
]
COMPLETION_BOUNDS = [
    ("prompt", ["a", ["a", "b"], [1, 2], [[1], [2, 3]]], ["", [], [""], [[]], [[1], []], 5, [1.5], [True]]),
    ("best_of", [None, 1], [0, -1]),
    ("logprobs", [None, 0, 5], [-1, 6]),
    ("max_tokens", [1, 16, 10**6], [-1, 1.5]),
    ("n", [1, 3], [0, -1]),
    ("seed", [None, 0, MAX_SEED], [-1, MAX_SEED + 1, 2**64]),
    ("stop", [None, "x", ["a", "b", "c", "d"]], ["", ["a", "b", "c", "d", "e"], "x" * 101]),
    ("temperature", [0, 2, 2.0], [-0.1, 2.000001, math.inf]),
    ("top_p", [1e-9, 1], [0, 1.000001]),
    ("echo", [True, False], ["yes"]),
    ("user", [None, "someone"], [5]),
    ("logit_bias", [None, {"50256": -100}, {"1": 100}], [{"1": -101}, {"1": 101}]),
    ("presence_penalty", [-2, 2], [-2.1, 2.1]),
    ("frequency_penalty", [-2, 2], [-2.1, 2.1]),
    ("suffix", [None, ""], ["x"]),
    ("stream_options", [None, {}, {"include_usage": True}], [{"include_usage": 1}, {"other": True}]),
    ("model", ["any name"], [None, 5]),
    ("ignore_eos", [True, False], [1]),
]

# The defaults the API documents: OpenAI's for /v1/completions, /generate's own.
GENERATE_DEFAULTS = {"max_new_tokens": 64, "temperature": 1.0, "top_k": None, "top_p": None, "seed": None, "stop": [],
                     "stream": False, "ignore_eos": False, "logprobs": None, "logit_bias": None,
                     "presence_penalty": 0.0, "frequency_penalty": 0.0, "cache_salt": None}
COMPLETION_DEFAULTS = {"best_of": None, "echo": False, "frequency_penalty": 0.0, "logit_bias": None, "logprobs": None,
                       "max_tokens": 16, "n": 1, "presence_penalty": 0.0, "seed": None, "stop": None, "stream": False,
                       "stream_options": None, "suffix": None, "temperature": 1.0, "top_p": 1.0, "user": None,
                       "ignore_eos": False, "cache_salt": None}


def accepts(model, body: dict) -> bool:
    try:
        model.model_validate(body)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("model, base, bounds", [(GenerateRequest, GENERATE, GENERATE_BOUNDS),
                                                 (CompletionRequest, COMPLETION, COMPLETION_BOUNDS)],
                         ids=["generate", "completions"])
def test_each_field_takes_its_range_and_refuses_the_first_value_past_each_end(model, base, bounds):
    wrong = [(name, value, "refused") for name, good, _ in bounds for value in good
             if not accepts(model, {**base, name: value})]
    wrong += [(name, value, "accepted") for name, _, bad in bounds for value in bad
              if accepts(model, {**base, name: value})]
    assert not wrong, wrong


@pytest.mark.parametrize("model, base", [(GenerateRequest, GENERATE), (CompletionRequest, COMPLETION)])
def test_an_unknown_field_is_refused_and_the_required_ones_are_required(model, base):
    assert accepts(model, base)
    assert not accepts(model, {**base, "promt": "typo"})
    for name in base:
        assert not accepts(model, {k: v for k, v in base.items() if k != name}), name


def test_stop_is_a_list_whether_one_string_or_several():
    assert GenerateRequest.model_validate({**GENERATE, "stop": "x"}).stop_strings == ["x"]
    assert GenerateRequest.model_validate({**GENERATE, "stop": ["x", "y"]}).stop_strings == ["x", "y"]
    assert GenerateRequest.model_validate(GENERATE).stop_strings == []
    assert CompletionRequest.model_validate(COMPLETION).stop_strings == []
    assert CompletionRequest.model_validate({**COMPLETION, "stop": "x"}).stop_strings == ["x"]
    assert CompletionRequest.model_validate({**COMPLETION, "stop": ["x", "y"]}).stop_strings == ["x", "y"]


@pytest.mark.parametrize("prompt, prompts, single", [
    ("a", ["a"], True), (["a", "b"], ["a", "b"], False), ([1, 2], [[1, 2]], True), ([[1], [2, 3]], [[1], [2, 3]], False),
    ([7], [[7]], True), (["a"], ["a"], False), ([[7]], [[7]], False)])
def test_each_prompt_form_gives_its_prompts(prompt, prompts, single):
    request = CompletionRequest.model_validate({**COMPLETION, "prompt": prompt})
    assert request.prompts == prompts and request.single_prompt is single


def test_a_prompt_of_no_accepted_form_says_what_the_forms_are_and_one_past_a_bound_says_the_bound():
    with pytest.raises(ValidationError, match="must be a text, a list of texts, a list of token ids"):
        CompletionRequest.model_validate({**COMPLETION, "prompt": {"text": "a"}})
    with pytest.raises(ValidationError) as refused:
        CompletionRequest.model_validate({**COMPLETION, "prompt": ""})
    assert "must be a text, a list of texts" not in str(refused.value)


def test_scoring_and_the_options_that_depend_on_each_other():
    assert accepts(CompletionRequest, {**COMPLETION, "max_tokens": 0, "echo": True})  # score the prompt
    assert not accepts(CompletionRequest, {**COMPLETION, "max_tokens": 0})
    assert accepts(CompletionRequest, {**COMPLETION, "stream": True})
    assert accepts(CompletionRequest, {**COMPLETION, "logprobs": 2})
    assert accepts(CompletionRequest, {**COMPLETION, "stream": True, "logprobs": 0})  # streamed logprobs (issue 51)
    assert accepts(CompletionRequest, {**COMPLETION, "n": 3, "best_of": 3})
    # Equal as numbers, each its own object (as two numbers of a JSON body are).
    assert CompletionRequest.model_validate_json(json.dumps({**COMPLETION, "n": 1000, "best_of": 1000})).n == 1000
    assert not accepts(CompletionRequest, {**COMPLETION, "n": 3, "best_of": 4})
    assert not accepts(CompletionRequest, {**COMPLETION, "n": 2, "best_of": 1})


@pytest.mark.parametrize("model, base, defaults", [(GenerateRequest, GENERATE, GENERATE_DEFAULTS),
                                                   (CompletionRequest, COMPLETION, COMPLETION_DEFAULTS)],
                         ids=["generate", "completions"])
def test_a_field_left_out_takes_its_documented_default(model, base, defaults):
    request = model.model_validate(base)
    assert {name: getattr(request, name) for name in defaults} == defaults
    assert set(model.model_fields) == set(base) | set(defaults)  # every field's default is written above


def test_best_of_below_one_is_refused_by_its_own_bound_not_as_differing_from_n():
    with pytest.raises(ValidationError) as refused:
        CompletionRequest.model_validate({**COMPLETION, "best_of": 0, "n": 0})
    assert sorted((e["loc"], e["type"]) for e in refused.value.errors()) == [
        (("best_of",), "greater_than_equal"), (("n",), "greater_than_equal")]
    with pytest.raises(ValidationError) as refused:
        CompletionRequest.model_validate({**COMPLETION, "best_of": 0})
    assert [(e["loc"], e["type"]) for e in refused.value.errors()] == [(("best_of",), "greater_than_equal")]


@pytest.mark.parametrize("model, base", [(GenerateRequest, GENERATE), (CompletionRequest, COMPLETION)],
                         ids=["generate", "completions"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_float_field_refuses_nan_and_infinity_as_not_finite_not_as_out_of_range(model, base, value):
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        with pytest.raises(ValidationError) as refused:
            model.model_validate({**base, name: value})
        assert [e["type"] for e in refused.value.errors()] == ["finite_number"], name
    with pytest.raises(ValidationError) as refused:
        model.model_validate({**base, "logit_bias": {"5": value}})
    assert [e["type"] for e in refused.value.errors()] == ["finite_number"]


def test_detokenize_takes_up_to_16384_ids():
    assert len(DetokenizeRequest.model_validate({"tokens": [0] * 16384}).tokens) == 16384
    with pytest.raises(ValidationError):
        DetokenizeRequest.model_validate({"tokens": [0] * 16385})
    assert TokenizeRequest.model_validate({"prompt": ""}).add_special_tokens is True


def test_stream_options_default_to_no_usage_chunk():
    assert StreamOptions.model_validate({}).include_usage is False
    assert StreamOptions.model_validate({"include_usage": True}).include_usage is True


def test_a_token_event_holds_the_documented_fields_and_no_others():
    """The schema a client checks /generate's token events against: a server that added a field, or dropped one,
    would be caught by it."""
    import jsonschema_rs
    document = {**TOKEN_EVENT_DATA, "components": {"schemas": {"TokenAlternative": TokenAlternative.model_json_schema()}}}
    valid = jsonschema_rs.validator_for(document).is_valid
    alternative = {"token": 5, "text": "b", "logprob": -2.0}
    for event in ({"token": 1, "text": "a"}, {"token": None, "text": ""},
                  {"token": 1, "text": "a", "logprob": -1.0, "top_logprobs": [alternative]}):
        assert valid(event), event
    for event in ({"token": 1, "text": "a", "extra": 1}, {"text": "a"}, {"token": 1}, {"token": "1", "text": "a"},
                  {"token": 1, "text": "a", "top_logprobs": [{"token": 5}]}):
        assert not valid(event), event
