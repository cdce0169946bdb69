"""Requests that join the running batch together: the prompts of one length (and, with the prefix cache, cached
prefixes as long) prefill in one pass (serve/prefill.py, serve/runner.py's `join_together`), and a traced step of a
few rows of one length runs in the aligned form, as generate() runs it (the runner's `_aligned`), through traces
warm_up made.
Every request gets the events it gets served alone."""
from __future__ import annotations

import time

import pytest
import torch

from decode.prefix_cache import PrefixCache, model_identity
from decode.sampling import SamplingParams
from decode.steps import DecodeSteps
from model.gpt import GPT
from serve.engine import Engine
from serve.events import GenerationRequest
from serve import runner
from serve.prefill import prefill, prefill_groups
from serve.runner import ALIGNED_ROWS
from tests.conftest import small_config
from tests.test_serve_async import Recorder, prompt, same, serve

BLOCK_SIZE = 64


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(small_config(block_size=BLOCK_SIZE, vocab_size=2048)).eval()


def jobs(lengths: list[int], new: int = 6) -> list[dict]:
    """A request per prompt length: greedy, seeded sampling and penalties in turn."""
    settings = [dict(temperature=0), dict(temperature=0.9, seed=3), dict(temperature=0, presence_penalty=1.5)]
    return [dict(prompt_ids=prompt(length, 11 + 53 * i),
                 params=SamplingParams(max_new_tokens=new, stop_at_eot=False, **settings[i % len(settings)]))
            for i, length in enumerate(lengths)]


def alone(model: GPT, jobs: list[dict], **settings) -> list[list[tuple]]:
    """Each job's events, served by itself."""
    return [serve(model, [job], "off", **settings)[0].events[0] for job in jobs]


@pytest.mark.parametrize("prefix_cache_bytes", [0, 1 << 22])
def test_prompts_of_one_length_prefill_in_one_pass_and_get_the_events_they_get_alone(model, prefix_cache_bytes,
                                                                                    monkeypatch):
    prefilled = []  # the prompts of each prefill pass: (rows, tokens)
    def counted(steps, prefix_cache, metrics, cache, requests, prompt, scored):
        prefilled.append(tuple(prompt.shape))
        return prefill(steps, prefix_cache, metrics, cache, requests, prompt, scored)
    monkeypatch.setattr(runner, "prefill", counted)
    together = jobs([9, 9, 9, 5])
    recorder, _ = serve(model, together, "off", max_batch_size=4, prefix_cache_bytes=prefix_cache_bytes)
    assert prefilled == [(3, 9), (1, 5)]  # the three of 9 tokens in one pass, then the one of 5
    assert same(recorder.events, alone(model, together, max_batch_size=4, prefix_cache_bytes=prefix_cache_bytes))


def test_groups_are_one_prompt_length_and_one_cached_prefix_length_in_order_of_arrival(model):
    engine = Engine(model, torch.device("cpu"), max_batch_size=8, max_queue=8, request_timeout_s=60,
                    prefix_cache_bytes=1 << 22)
    requests = [GenerationRequest(on_event=lambda event: None, **job) for job in jobs([20, 7, 20, 7, 20])]
    shared = prompt(16, 999)  # one cached block: a prompt after it reuses 16 tokens
    engine.runner.prefix_cache.prefill(model, engine.runner.steps.new_cache(1, 17), shared + [1], False)
    requests.append(GenerationRequest(shared + [5, 6, 7, 8], SamplingParams(), lambda event: None))
    requests.append(GenerationRequest(requests[0].prompt_ids, SamplingParams(), lambda event: None, echo=True,
                                      logprobs=0))  # scored: alone
    groups = prefill_groups(requests, engine.runner.prefix_cache)
    assert [[requests.index(r) for r in group] for group in groups] == [[0, 2, 4], [1, 3], [5], [6]]
    assert len(prefill_groups(requests[:3], None, one_at_a_time=True)) == 3  # with a draft
    assert len(prefill_groups(requests[:3], None)) == 2  # no prefix cache: by length alone
    salted = GenerationRequest(shared + [5, 6, 7, 8], SamplingParams(), lambda event: None, cache_salt=b"other")
    # another salt finds no cached block
    assert len(prefill_groups([requests[5], salted], engine.runner.prefix_cache)) == 2


def test_rows_prefilled_together_reuse_the_shortest_of_their_cached_prefixes(model):
    cache = PrefixCache(1 << 22, model_identity(model))
    first, second = prompt(40, 3), prompt(40, 500)
    cache.prefill(model, _cache(model, 1, 40), first[:33], False)  # two blocks of `first` cached
    rows = _cache(model, 2, 40)
    done = cache.prefill_rows(model, rows, [first, second], False, [b"", b""])
    assert done.reused_tokens == 0  # `second` has none: neither row reuses
    again = cache.prefill_rows(model, _cache(model, 2, 40), [first, second], False, [b"", b""])
    assert again.reused_tokens == 32  # both now have two blocks cached (the pass above stored `second`'s)
    for row, ids in enumerate([first, second]):
        single = cache.prefill(model, _cache(model, 1, 40), ids, False)
        assert torch.allclose(again.logits[row], single.logits[0], atol=1e-4)
        assert torch.allclose(done.logits[row], single.logits[0], atol=1e-4)
    with pytest.raises(ValueError, match=r"one length and a salt each: lengths \[39, 40\]"):
        cache.prefill_rows(model, _cache(model, 2, 40), [first, second[:39]], False, [b"", b""])


def _cache(model: GPT, rows: int, width: int):
    return DecodeSteps(model, torch.device("cpu"), "dynamic").new_cache(rows, width)


def test_a_few_traced_rows_of_one_length_step_aligned_through_the_traces_warm_up_made(model):
    engine = Engine(model, torch.device("cpu"), max_batch_size=8, max_queue=8, request_timeout_s=60, decode="traced")
    engine.warm_up()
    traces = len(engine.runner.steps.traced.traces)
    forms = []
    logits = engine.runner.steps.logits

    def watched(cache, inputs, positions, tokens_left=None):
        if cache.length > 0 and inputs.size(0) > 1:
            forms.append((inputs.size(0), cache.aligned))
        return logits(cache, inputs, positions, tokens_left)
    engine.runner.steps.logits = watched
    engine.start()
    try:
        for lengths in ([12] * ALIGNED_ROWS, [12, 12, 13], [12] * (ALIGNED_ROWS + 1)):
            recorder = Recorder(len(lengths))
            for i, job in enumerate(jobs(lengths)):
                engine.submit(GenerationRequest(on_event=recorder.callback(i), **job))
            deadline = time.monotonic() + 60
            while recorder.ended < len(lengths):
                assert time.monotonic() < deadline, f"only {recorder.ended} of {len(lengths)} requests ended"
                time.sleep(0.01)
            assert same(recorder.events, alone(model, jobs(lengths), decode="traced", max_batch_size=8))
    finally:
        engine.stop()
    assert set(forms) == {(ALIGNED_ROWS, True), (3, False), (8, False)}  # one length; two lengths; padded to 8
    assert len(engine.runner.steps.traced.traces) == traces  # every form was traced before the first request


def test_a_request_whose_first_token_fails_ends_alone_and_its_group_goes_on(model):
    """A failure while one request of a group takes its first token (here its client's callback raises) ends that
    request with an error; the others prefilled in the same pass get the events they get alone."""
    together = jobs([9, 9, 9])
    engine = Engine(model, torch.device("cpu"), max_batch_size=4, max_queue=8, request_timeout_s=60,
                    decode="dynamic")
    recorder = Recorder(len(together))
    failing = recorder.callback(1)

    def raises_once(event, raised=[]):
        if not raised:
            raised.append(event)
            raise RuntimeError("the client's callback failed")
        failing(event)
    callbacks = [recorder.callback(0), raises_once, recorder.callback(2)]
    engine.start()
    try:
        for job, callback in zip(together, callbacks):
            engine.submit(GenerationRequest(on_event=callback, **job))
        deadline = time.monotonic() + 60
        while recorder.ended < len(together):
            assert time.monotonic() < deadline, f"only {recorder.ended} requests ended"
            time.sleep(0.01)
    finally:
        engine.stop()
    assert recorder.events[1] == [("error", "internal", recorder.events[1][0][2])]
    expected = alone(model, together, max_batch_size=4)
    assert same([recorder.events[0], recorder.events[2]], [expected[0], expected[2]])
