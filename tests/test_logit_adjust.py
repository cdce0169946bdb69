"""logit_bias and the presence and frequency penalties (issue 51.4), OpenAI's semantics, through the one
request-to-SamplingParams mapping (decode/request_sampling.py) that the server's doors and sample.py share."""
from __future__ import annotations

import pytest
import torch

from decode.generate import generate
from decode.request_sampling import MAX_LOGIT_BIAS_ENTRIES, sampling_params
from decode.sampling import SamplingError, SamplingParams, adjust_logits, sample_rows
from model.gpt import GPT
from tests.conftest import small_config

VOCAB = 2048


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(small_config(block_size=64, vocab_size=VOCAB)).eval()


def test_bias_and_penalties_follow_openais_formula_on_the_rows_that_ask_for_them():
    logits = torch.randn(3, 10)
    generated = [[4, 4, 7], [4, 4, 7], []]
    params = [SamplingParams(logit_bias=((1, 5.0), (9, -3.0)), presence_penalty=0.5, frequency_penalty=0.25),
              SamplingParams(), SamplingParams(presence_penalty=2.0)]
    adjusted = logits.clone()
    adjust_logits(adjusted, params, generated)
    expected = logits[0].clone()
    expected[1] += 5.0
    expected[9] -= 3.0
    expected[4] -= 2 * 0.25 + 0.5  # logits[j] -= c[j] * frequency + (c[j] > 0) * presence
    expected[7] -= 1 * 0.25 + 0.5
    assert torch.equal(adjusted[0], expected)
    assert torch.equal(adjusted[1:], logits[1:])  # a row without them, and a penalty with nothing generated yet


def test_a_full_positive_bias_forces_a_token_and_a_full_negative_one_bans_the_best():
    torch.manual_seed(0)
    logits = torch.randn(4, VOCAB) * 3
    generators = [torch.Generator().manual_seed(i) for i in range(4)]
    forced = [SamplingParams(temperature=1.0, logit_bias=((123, 100.0),)) for _ in range(4)]
    assert sample_rows(logits, forced, generators, [[]] * 4) == [123] * 4
    best = logits.argmax(-1).tolist()
    banned = [SamplingParams(temperature=0, logit_bias=((b, -100.0),)) for b in best]
    tokens = sample_rows(logits, banned, generators, [[]] * 4)
    assert tokens == logits.topk(2, dim=-1).indices[:, 1].tolist() and all(t != b for t, b in zip(tokens, best))


def test_a_strong_frequency_penalty_prevents_repeats(model):
    prompt = torch.tensor([[1, 2, 3]])
    plain = generate(model, prompt, SamplingParams(max_new_tokens=24, temperature=0, stop_at_eot=False))[0, 3:]
    assert len(set(plain.tolist())) < 24  # greedy on a small random model repeats itself
    penalised = generate(model, prompt, SamplingParams(max_new_tokens=24, temperature=0, stop_at_eot=False,
                                                       frequency_penalty=2.0, presence_penalty=2.0))[0, 3:]
    assert len(set(penalised.tolist())) == 24


def test_greedy_rows_are_unchanged_when_batched_with_penalised_and_biased_rows(model):
    from serve.engine import Engine
    from tests.test_serve_engine import run
    greedy = SamplingParams(max_new_tokens=12, temperature=0, stop_at_eot=False)
    others = [SamplingParams(max_new_tokens=12, temperature=0.9, seed=3, stop_at_eot=False, frequency_penalty=1.5),
              SamplingParams(max_new_tokens=12, temperature=0, stop_at_eot=False, logit_bias=((7, 100.0),)),
              SamplingParams(max_new_tokens=12, temperature=0, stop_at_eot=False, presence_penalty=-2.0)]
    prompts = [[1, 2, 3], [5, 6], [9], [4, 4, 4, 4]]
    engine = Engine(model, torch.device("cpu"), max_batch_size=4, max_queue=8, request_timeout_s=60)
    engine.start()
    try:
        alone = [run(engine, [(ids, greedy)]).tokens[0] for ids in prompts]
        together = run(engine, [(prompts[0], greedy), (prompts[1], others[0]), (prompts[2], greedy),
                                (prompts[3], others[1]), (prompts[1], greedy), (prompts[0], others[2]),
                                (prompts[3], greedy)]).tokens
    finally:
        engine.stop()
    assert [together[0], together[2], together[4], together[6]] == [alone[0], alone[2], alone[1], alone[3]]
    assert together[3] == [7] * 12  # the biased row is forced, batched or not
    # Each adjusted row is what generate() gives it alone: the same sampler, fed the row's own tokens.
    for ids, params, tokens in [(prompts[1], others[0], together[1]), (prompts[0], others[2], together[5])]:
        assert generate(model, torch.tensor([ids]), params)[0, len(ids):].tolist() == tokens


@pytest.mark.parametrize("fields, message", [
    ({"logit_bias": {"abc": 1}}, "key 'abc' is not a token id"),
    ({"logit_bias": {"-1": 1}}, "key '-1' is not a token id"),
    ({"logit_bias": {" 7": 1}}, "key ' 7' is not a token id"),
    ({"logit_bias": {"٣": 1}}, "is not a token id"),  # a digit to str.isdigit, not an id
    ({"logit_bias": {str(VOCAB): 1}}, f"token id {VOCAB} is outside the vocabulary; ids run from 0 to {VOCAB - 1}"),
    ({"logit_bias": {"7": 101}}, "the bias of token 7 must be in [-100, 100], got 101"),
    ({"logit_bias": {"7": float("nan")}}, "the bias of token 7 must be in [-100, 100]"),
    ({"logit_bias": {"7": "1"}}, "the bias of token 7 must be a number"),
    ({"logit_bias": {"7": 1, "007": 2}}, "token id 7 is given twice"),
    ({"logit_bias": {str(i): 1 for i in range(MAX_LOGIT_BIAS_ENTRIES + 1)}}, "at most 300 are allowed"),
    ({"presence_penalty": 2.5}, "presence_penalty must be in [-2, 2], got 2.5"),
    ({"frequency_penalty": float("inf")}, "frequency_penalty must be in [-2, 2]"),
])
def test_bad_bias_and_penalties_are_refused_naming_the_field(fields, message):
    with pytest.raises(SamplingError, match="^.*" + message.replace("[", r"\[").replace("(", r"\(")) as caught:
        sampling_params(fields, VOCAB)
    assert caught.value.field == next(iter(fields)) and "\n" not in str(caught.value)


# Keys and values at the edges of what is taken, as the message shows them: ints (a Python caller's keys), ints past
# what str() writes (4,300 digits), and text cut at 40 characters.
@pytest.mark.parametrize("bias, message", [
    ({-1: 1}, "key -1 is not a token id"),
    ({True: 1}, "key True is not a token id"),
    ({str(VOCAB + 1): 1}, f"token id {VOCAB + 1} is outside the vocabulary"),
    ({VOCAB + 5: 1}, f"token id {VOCAB + 5} is outside the vocabulary"),
    ({2 ** 13999: 1}, "token id 13149501836626558901... (4215 characters) is outside the vocabulary"),
    ({2 ** 14000: 1}, "token id <an integer of 14001 bits> is outside the vocabulary"),
    ({"a" * 38: 1}, f"key '{'a' * 38}' is not a token id"),
    ({"a" * 39: 1}, f"key '{'a' * 19}... (41 characters) is not a token id"),
    ({"7": "12"}, "the bias of token 7 must be a number in [-100, 100], got '12'"),
    ({"7": 2 ** 20000}, "the bias of token 7 must be a number in [-100, 100], got <an integer of 20001 bits>"),
])
def test_bias_refusals_show_the_key_or_value_as_given_and_cut_short(bias, message):
    with pytest.raises(SamplingError) as caught:
        sampling_params({"logit_bias": bias}, VOCAB)
    assert str(caught.value) == f"logit_bias: {message}" + \
        ('; write each id as a decimal string, e.g. {"50256": -100}' if "not a token id" in message else
         f"; ids run from 0 to {VOCAB - 1}" if "outside" in message else "")


def test_bias_keys_at_the_edges_of_what_is_taken():
    """As many entries as OpenAI allows; ids 0 and the last as ints; a decimal key as long as the vocabulary's size."""
    most = {str(i): 1 for i in range(MAX_LOGIT_BIAS_ENTRIES)}
    assert len(sampling_params({"logit_bias": most}, VOCAB).logit_bias) == MAX_LOGIT_BIAS_ENTRIES
    assert sampling_params({"logit_bias": {0: 1, 5: 2, VOCAB - 1: 3}}, VOCAB).logit_bias == \
        ((0, 1.0), (5, 2.0), (VOCAB - 1, 3.0))
    assert sampling_params({"logit_bias": {str(VOCAB - 1): -4}}, VOCAB).logit_bias == ((VOCAB - 1, -4.0),)


def test_a_request_without_ignore_eos_stops_at_end_of_text():
    assert sampling_params({}, VOCAB).stop_at_eot and sampling_params({"ignore_eos": False}, VOCAB).stop_at_eot
    assert not sampling_params({"ignore_eos": True}, VOCAB).stop_at_eot


def test_speculative_decoding_refuses_what_its_checks_cannot_honour(model):
    for field, value in [("logit_bias", {"1": 2}), ("presence_penalty", 0.1), ("frequency_penalty", -0.1)]:
        with pytest.raises(SamplingError, match=f"^{field} is not available with speculative decoding") as caught:
            sampling_params({field: value}, VOCAB, speculative=True)
        assert caught.value.field == field
    assert sampling_params({"temperature": 0}, VOCAB, speculative=True).greedy
    with pytest.raises(SamplingError, match="not available with speculative decoding"):
        generate(model, torch.tensor([[1]]), SamplingParams(max_new_tokens=2, presence_penalty=1.0), draft=model)


def test_the_mapping_gives_each_door_the_same_params():
    fields = {"max_new_tokens": 5, "temperature": 0.7, "top_p": 1.0, "seed": 3, "ignore_eos": True,
              "logit_bias": {"9": -100, "2": 3}, "presence_penalty": 0.5, "frequency_penalty": 0.0}
    assert sampling_params(fields, VOCAB) == SamplingParams(
        max_new_tokens=5, temperature=0.7, top_p=None, seed=3, stop_at_eot=False, logit_bias=((2, 3.0), (9, -100.0)),
        presence_penalty=0.5)
    with pytest.raises(TypeError, match="not sampling fields"):
        sampling_params({"max_tokens": 5}, VOCAB)
