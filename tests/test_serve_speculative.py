"""The serving engine with a draft model (python -m serve --draft): greedy rows get the model's own tokens while
rows join and leave, seeds repeat, stop conditions end a row inside a step, the counts reach /metrics and the
replies, and a draft that cannot serve the model is refused."""
from __future__ import annotations

import pytest
import torch

from model.config import EOT_TOKEN
from decode.generate import generate
from model.gpt import GPT
from decode.sampling import SamplingParams
from decode.speculative import DraftMismatch, SpeculativeStats
from prune.structured import select_units, shrink
from serve.engine import Engine
from serve.events import DoneEvent, Latency
from serve.routes_generate import response_body
from serve.routes_openai import usage
from tests.conftest import small_config
from tests.test_serve_engine import run
from tests.test_speculative import eot_prone_target, prompts

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def target() -> GPT:
    torch.manual_seed(0)
    return GPT(small_config(block_size=48, vocab_size=2048)).eval()


def start(target: GPT, draft: GPT, rows: int = 4, draft_tokens: int = 3) -> Engine:
    engine = Engine(target, CPU, max_batch_size=rows, max_queue=64, request_timeout_s=60, draft=draft,
                    draft_tokens=draft_tokens)
    engine.start()
    return engine


def greedy_jobs(count: int, block_size: int) -> list[tuple[list[int], SamplingParams]]:
    g = torch.Generator().manual_seed(2)
    jobs = []
    for _ in range(count):
        prompt_len = int(torch.randint(1, block_size // 2, (1,), generator=g))
        max_new = int(torch.randint(1, block_size - prompt_len + 1, (1,), generator=g))
        ids = torch.randint(0, 2048, (prompt_len,), generator=g).tolist()
        jobs.append((ids, SamplingParams(max_new_tokens=max_new, temperature=0, stop_at_eot=False)))
    return jobs


@pytest.mark.parametrize("kind", ["random", "pruned", "itself"])
def test_greedy_rows_get_the_models_own_tokens_while_rows_join_and_leave(target, kind):
    if kind == "random":
        torch.manual_seed(1)
        draft = GPT(small_config(n_layer=1, block_size=48, vocab_size=2048)).eval()
    else:
        draft = target if kind == "itself" else shrink(target, *select_units(target, 0.5, target.config)).eval()
    engine = start(target, draft)
    try:
        jobs = greedy_jobs(12, target.config.block_size)  # more requests than rows: they wait, join and leave
        together = run(engine, jobs)
    finally:
        engine.stop()
    for i, (ids, params) in enumerate(jobs):
        expected = generate(target, torch.tensor([ids]), params, decode="dynamic")[0, len(ids):].tolist()
        assert together.tokens[i] == expected
        done = together.ends[i]
        assert done.tokens == params.max_new_tokens  # a step that kept more than the row needed ended it in time
        stats = done.speculative
        assert stats.accepted <= stats.proposed and stats.row_steps >= 1
    rendered = engine.metrics.render()
    proposed = sum(ends.speculative.proposed for ends in together.ends.values())
    assert f"serve_draft_tokens_proposed_total {proposed}" in rendered
    assert "serve_speculative_steps_total" in rendered


def test_the_model_as_its_own_draft_keeps_every_proposal(target):
    engine = start(target, target, rows=2, draft_tokens=4)
    try:
        jobs = [([5, 6, 7], SamplingParams(max_new_tokens=21, temperature=0, stop_at_eot=False))]
        done = run(engine, jobs).ends[0]
    finally:
        engine.stop()
    # 1 token from the prefill, then 4 passes of 5 tokens.
    assert (done.speculative.proposed, done.speculative.accepted, done.speculative.row_steps) == (16, 16, 4)
    assert done.speculative.tokens_per_target_pass == 5.0


def test_seeded_sampling_repeats_and_seeds_differ(target):
    draft = shrink(target, *select_units(target, 0.5, target.config)).eval()
    engine = start(target, draft)
    params = lambda seed: SamplingParams(max_new_tokens=20, temperature=1.0, top_k=50, seed=seed, stop_at_eot=False)
    try:
        first, again, other = (run(engine, [([1, 2, 3], params(seed))]).tokens[0] for seed in (7, 7, 8))
    finally:
        engine.stop()
    assert first == again and first != other and len(first) == 20


def test_end_of_text_inside_a_step_ends_the_row_there():
    """The model as its own draft keeps every proposal, so its steps run past a row's end-of-text: the reply
    stops at end-of-text all the same, with generate()'s tokens."""
    model = eot_prone_target()
    engine = start(model, model, rows=3)
    params = SamplingParams(max_new_tokens=16, temperature=0)
    jobs = [(ids, params) for ids in prompts(5, 6, 34).tolist() + prompts(4, 9, 1).tolist()]
    try:
        together = run(engine, jobs)
    finally:
        engine.stop()
    reasons = []
    for i, (ids, _) in enumerate(jobs):
        expected = generate(model, torch.tensor([ids]), params, decode="dynamic")[0, len(ids):].tolist()
        if EOT_TOKEN in expected:
            expected = expected[:expected.index(EOT_TOKEN) + 1]
        assert together.tokens[i] + [EOT_TOKEN] * (together.ends[i].finish_reason == "eos") == expected
        assert together.ends[i].tokens == len(expected)
        reasons.append(together.ends[i].finish_reason)
    assert "eos" in reasons and "length" in reasons


def test_a_draft_that_cannot_serve_the_model_is_refused(target):
    other_vocabulary = GPT(small_config(block_size=48, vocab_size=1024)).eval()
    with pytest.raises(DraftMismatch, match="vocabulary has 1024 tokens and the target's 2048"):
        Engine(target, CPU, 2, 2, 60, draft=other_vocabulary)
    shorter = GPT(small_config(block_size=32, vocab_size=2048)).eval()
    with pytest.raises(DraftMismatch, match="context of 32 tokens is shorter than the 48"):
        Engine(target, CPU, 2, 2, 60, draft=shorter)


def test_replies_carry_the_draft_counts():
    latency = Latency(1.0, 2.0, 3.0, 4.0)
    done = lambda stats: DoneEvent("ab", "", 5, 3, "length", latency, speculative=stats)
    stats = SpeculativeStats(proposed=8, accepted=6, target_passes=2, row_steps=2)
    body = response_body(done(stats)).speculative
    assert (body.draft_tokens_proposed, body.draft_tokens_accepted, body.acceptance_rate,
            body.tokens_per_target_pass) == (8, 6, 0.75, 4.0)
    details = usage([done(stats), done(SpeculativeStats(proposed=4, accepted=1, row_steps=1))], 1)
    assert details.completion_tokens_details.model_dump() == {"accepted_prediction_tokens": 7,
                                                              "rejected_prediction_tokens": 5}
    assert response_body(done(None)).speculative is None and usage([done(None)], 1).completion_tokens_details is None


def test_greedy_rows_keep_the_models_tokens_beside_sampled_rows(target):
    """One step serves rows with different settings: the greedy ones still get the model's own tokens."""
    draft = shrink(target, *select_units(target, 0.5, target.config)).eval()
    engine = start(target, draft)
    greedy = greedy_jobs(3, target.config.block_size)
    sampled = [([4, 5, 6], SamplingParams(max_new_tokens=20, temperature=0.9, top_p=0.9, seed=i, stop_at_eot=False))
               for i in range(3)]
    jobs = [job for pair in zip(greedy, sampled) for job in pair]
    try:
        together = run(engine, jobs)
    finally:
        engine.stop()
    for i, (ids, params) in enumerate(jobs):
        assert together.ends[i].tokens == params.max_new_tokens
        if params.greedy:
            expected = generate(target, torch.tensor([ids]), params, decode="dynamic")[0, len(ids):].tolist()
            assert together.tokens[i] == expected
