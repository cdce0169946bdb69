"""Speculative decoding: greedy tokens equal the target's own, sampled tokens follow the target's distribution,
ragged batches, end-of-text and max_new_tokens, int8 models, clear refusals, and sample.py --draft."""
from __future__ import annotations


import pytest
import torch

from model.config import EOT_TOKEN, GPTConfig
from model.gpt import GPT
from model.kv_cache import KVCache
from decode.generate import generate
from model.int8 import quantize_model
from decode.sampling import SamplingParams
from decode.speculative import DraftMismatch, SpeculativeStats, sampling_probs
from prune.structured import select_units, shrink
from tests.conftest import small_config
from tests.test_sample import run_sample


def eot_prone_target() -> GPT:
    """A seeded small model whose end-of-text logit varies more than the others', so that greedy rows stop at
    different steps (and some never)."""
    torch.manual_seed(0)
    model = GPT(small_config()).eval()
    with torch.no_grad():
        model.transformer.wte.weight[EOT_TOKEN] *= 3.5
    return model


def draft_for(target: GPT, kind: str) -> GPT:
    if kind == "random":  # a bad draft: its own random weights, one layer
        torch.manual_seed(1)
        return GPT(small_config(n_layer=1)).eval()
    if kind == "itself":
        return target
    return shrink(target, *select_units(target, 0.5, target.config)).eval()  # "pruned": prune --method row


def prompts(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, EOT_TOKEN, (batch, length), generator=torch.Generator().manual_seed(seed))


GREEDY = SamplingParams(max_new_tokens=16, temperature=0)
# (batch, prompt length, prompt seed, draft tokens): a one-token prompt; rows that stop at end-of-text at different
# steps next to rows that run to max_new_tokens (seeds 1 and 3); two rows that both stop early (seed 34).
CASES = [(1, 1, 0, 1), (2, 6, 34, 4), (4, 9, 1, 7), (5, 3, 3, 3)]


# Each draft with one way of running the passes: traced (decode auto, the default) or eager (dynamic).
@pytest.mark.parametrize("kind, decode", [("random", "dynamic"), ("itself", "dynamic"), ("pruned", "auto")])
def test_greedy_tokens_are_the_targets_own(kind, decode):
    target = eot_prone_target()
    draft = draft_for(target, kind)
    stopped_early = ran_to_the_end = all_stopped = 0
    for batch, length, seed, k in CASES:
        idx = prompts(batch, length, seed)
        expected = generate(target, idx, GREEDY, decode="dynamic")
        stats = SpeculativeStats()
        assert torch.equal(generate(target, idx, GREEDY, draft=draft, draft_tokens=k, stats=stats, decode=decode),
                           expected)
        # A pass gives a row at most k + 1 tokens; rows leave the batch when they end.
        assert stats.row_steps >= stats.target_passes >= -(-(expected.size(1) - length) // (k + 1))
        if kind == "itself":
            assert stats.accepted == stats.proposed > 0
        ended = (expected[:, length:] == EOT_TOKEN).any(1)
        stopped_early += int(ended.sum())
        ran_to_the_end += int((~ended).sum())
        all_stopped += expected.size(1) < length + GREEDY.max_new_tokens
    assert stopped_early and ran_to_the_end and all_stopped  # the cases exercise every way a row ends


def test_good_draft_is_accepted_more_than_a_bad_one():
    target = eot_prone_target()
    idx = prompts(3, 5, 1)
    rates = {}
    for kind in ("random", "pruned"):
        stats = SpeculativeStats()
        generate(target, idx, GREEDY, draft=draft_for(target, kind), draft_tokens=4, stats=stats)
        rates[kind] = stats.acceptance_rate
        assert stats.tokens_per_target_pass == pytest.approx((stats.accepted + stats.row_steps) / stats.row_steps)
        assert "draft tokens accepted" in stats.summary()
    assert rates["pruned"] > 0.5 > rates["random"]


def test_int8_target_and_draft_give_the_int8_targets_greedy_tokens_but_for_near_ties():
    """The int8 layers quantize their input with one scale per tensor, so a position's logits move a little with
    the other positions of its pass: a verification pass holds k + 1 of them, a plain step one.  Most runs give
    the int8 target's own tokens exactly; where one does not, its first difference is a near tie of the target's
    logits (here within 0.01, a tenth of their standard deviation; measured: 0.0065 and 0.0003)."""
    target = eot_prone_target()
    draft = draft_for(target, "pruned")
    quantize_model(target)
    quantize_model(draft)
    runs = exact = 0
    for batch, length, seed, k in CASES:
        idx = prompts(batch, length, seed)
        expected = generate(target, idx, GREEDY, decode="dynamic")
        for draft_tokens in (k, 4):
            out = generate(target, idx, GREEDY, draft=draft, draft_tokens=draft_tokens)
            runs += 1
            exact += torch.equal(out, expected)
            width = min(out.size(1), expected.size(1))
            for row in range(batch):
                differ = (out[row, :width] != expected[row, :width]).nonzero()
                if len(differ):
                    column = int(differ[0])
                    with torch.no_grad():
                        logits = target(expected[row:row + 1, :column])[0][0, -1]
                    assert abs(float(logits[expected[row, column]] - logits[out[row, column]])) < 0.01
    assert exact >= runs // 2


def test_streamed_columns_are_the_returned_tokens():
    target = eot_prone_target()
    idx = prompts(4, 9, 1)
    columns = []
    out = generate(target, idx, GREEDY, draft=draft_for(target, "pruned"), draft_tokens=3, on_token=columns.append)
    assert torch.equal(torch.stack(columns, 1), out[:, 9:])


def test_max_new_tokens_is_exact_and_zero_returns_the_prompt():
    target = eot_prone_target()
    idx = prompts(2, 4, 1)
    for new in (0, 1, 2, 5):
        params = SamplingParams(max_new_tokens=new, temperature=0, stop_at_eot=False)
        out = generate(target, idx, params, draft=target, draft_tokens=4)
        assert out.shape == (2, 4 + new) and torch.equal(out, generate(target, idx, params, decode="dynamic"))


def test_prompt_and_new_tokens_may_fill_the_whole_context():
    target = eot_prone_target()
    idx = prompts(2, 50, 3)
    params = SamplingParams(max_new_tokens=14, temperature=0, stop_at_eot=False)  # 64 = block_size
    assert torch.equal(generate(target, idx, params, draft=draft_for(target, "pruned"), draft_tokens=7),
                       generate(target, idx, params, decode="dynamic"))


def test_seeded_sampling_is_reproducible():
    target = eot_prone_target()
    draft = draft_for(target, "pruned")
    idx = prompts(3, 4, 0)
    params = dict(max_new_tokens=8, temperature=0.9, top_k=50)
    run = lambda seed: generate(target, idx, SamplingParams(**params, seed=seed), draft=draft, draft_tokens=3)
    first = run(7)
    assert torch.equal(first, run(7)) and not torch.equal(first, run(8))


# --- the sampled distribution ------------------------------------------------------------------------------------

VOCAB = 8


def peaked_tiny_model(seed: int) -> GPT:
    """A one-layer model over 8 tokens; its embeddings scaled up so that its next-token distributions are far
    from uniform (a draft of another seed then disagrees with it: total variation ~0.4 over two tokens)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=VOCAB, vocab_pad_multiple=8))
    with torch.no_grad():
        model.transformer.wte.weight.mul_(8)
    return model.eval()


def two_token_distribution(model: GPT, prompt: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The exact (VOCAB, VOCAB) probabilities of the next two tokens under `params`."""
    with torch.no_grad():
        first = sampling_probs(model(prompt)[0][:, -1], params)[0]
        extended = torch.cat([prompt.expand(VOCAB, -1), torch.arange(VOCAB)[:, None]], 1)
        second = sampling_probs(model(extended)[0][:, -1], params)
    return first[:, None] * second


def empirical(out: torch.Tensor) -> torch.Tensor:
    pairs = out[:, -2] * VOCAB + out[:, -1]
    return torch.bincount(pairs, minlength=VOCAB * VOCAB).double().view(VOCAB, VOCAB).float() / out.size(0)


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.8, top_k=5, top_p=0.9)])
def test_sampled_tokens_follow_the_targets_distribution(settings):
    target, draft = peaked_tiny_model(0), peaked_tiny_model(3)
    prompt = torch.tensor([[3, 1]])
    params = SamplingParams(max_new_tokens=2, seed=11, stop_at_eot=False, **settings)
    exact = two_token_distribution(target, prompt, params)
    assert total_variation(exact, two_token_distribution(draft, prompt, params)) > 0.3  # the draft alone is wrong
    rows = prompt.expand(4000, -1)  # row i draws from seed + i: 4,000 independent samples
    stats = SpeculativeStats()
    speculative = empirical(generate(target, rows, params, draft=draft, draft_tokens=2, stats=stats))
    plain = empirical(generate(target, rows, params, decode="dynamic"))
    assert 0.2 < stats.acceptance_rate < 0.95  # rejections happen, and rows keep different counts
    # With 4,000 samples the empirical distance to the exact one came out at 0.01-0.05 over several seeds.
    assert total_variation(speculative, exact) < 0.07
    assert total_variation(plain, exact) < 0.07
    assert total_variation(speculative.sum(1), exact.sum(1)) < 0.04  # the first token alone


# --- refusals ----------------------------------------------------------------------------------------------------

def test_a_draft_with_another_vocabulary_or_a_shorter_context_is_refused():
    target = eot_prone_target()
    idx = prompts(1, 4, 0)
    torch.manual_seed(0)
    with pytest.raises(DraftMismatch, match="vocabulary has 50000 tokens and the target's 50257"):
        generate(target, idx, GREEDY, draft=GPT(small_config(vocab_size=50000)))
    with pytest.raises(DraftMismatch, match="context of 16 tokens is shorter than the 20 that the prompt"):
        generate(target, idx, GREEDY, draft=GPT(small_config(block_size=16)))
    with pytest.raises(DraftMismatch, match="draft_tokens must be at least 1"):
        generate(target, idx, GREEDY, draft=target, draft_tokens=0)


def test_every_decode_mode_the_device_has_decodes_speculatively_to_the_targets_tokens():
    # One step runner (decode/steps.py) for plain and speculative decoding: the fixed-shape cache of the
    # static mode (what a CUDA graph captures) keeps rows at their own lengths as the filled-columns cache does.
    target = eot_prone_target()
    draft = draft_for(target, "random")
    idx = prompts(3, 5, 4)
    expected = generate(target, idx, GREEDY, decode="dynamic")
    for decode in ("static", "traced"):
        stats = SpeculativeStats()
        assert torch.equal(generate(target, idx, GREEDY, draft=draft, draft_tokens=3, decode=decode, stats=stats),
                           expected), decode
        assert 0 < stats.accepted < stats.proposed  # rows kept different counts


# --- the ragged cache --------------------------------------------------------------------------------------------

def test_cache_rows_continue_from_their_own_lengths():
    torch.manual_seed(0)
    model = GPT(small_config()).eval()
    first, more = prompts(2, 6, 0), prompts(2, 3, 1)
    cache = KVCache.allocate(model.config, 2, 12, "cpu")
    with torch.no_grad():
        model(first, cache=cache)
        cache.truncate(torch.tensor([6, 2]))  # row 1 drops its last 4 tokens
        assert cache.lengths.tolist() == [6, 2] and cache.length == 6
        logits, _ = model(more, cache=cache)
        assert cache.lengths.tolist() == [9, 5]
        for row, kept in ((0, 6), (1, 2)):
            alone, _ = model(torch.cat([first[row, :kept], more[row]])[None])
            torch.testing.assert_close(logits[row], alone[0, -3:], atol=1e-5, rtol=0)
        cache.keep_rows(torch.tensor([1]))  # row 0 leaves; row 1 continues alone
        last, _ = model(more[1:, :1], cache=cache)
        alone, _ = model(torch.cat([first[1, :2], more[1], more[1, :1]])[None])
        torch.testing.assert_close(last[0, -1], alone[0, -1], atol=1e-5, rtol=0)
        assert cache.lengths.tolist() == [6]


# --- sample.py ---------------------------------------------------------------------------------------------------

def test_sample_py_with_a_pruned_draft(tmp_path):
    from runtime.provenance import provenance
    from storage.artifact import save_artifact
    target = eot_prone_target()
    draft = draft_for(target, "pruned")
    save_artifact(tmp_path / "target", target, target.config, "float", provenance("tests"))
    save_artifact(tmp_path / "draft", draft, draft.config, "pruned", provenance("tests"))
    args = ["--checkpoint", str(tmp_path / "target"), "--prompt", "Hello", "--max-new-tokens", "12",
            "--temperature", "0", "--num-samples", "2"]
    plain = run_sample(*args)
    speculative = run_sample(*args, "--draft", str(tmp_path / "draft"), "--draft-tokens", "3")
    assert plain.returncode == speculative.returncode == 0, speculative.stderr
    assert speculative.stdout == plain.stdout
    assert "loaded pruned draft model" in speculative.stderr and "draft tokens accepted" in speculative.stderr

    torch.manual_seed(0)
    short = GPT(small_config(block_size=8))
    save_artifact(tmp_path / "short", short, short.config, "float", provenance("tests"))
    refused = run_sample(*args, "--draft", str(tmp_path / "short"))
    assert refused.returncode != 0 and "draft model's context of 8 tokens is shorter" in refused.stderr


def test_auto_traces_both_models_passes_after_the_prompt_aligned_or_not(monkeypatch):
    from decode.trace import TracedSteps
    target = eot_prone_target()
    draft = draft_for(target, "random")
    traced_steps = []  # (which model, rows, tokens per row, whether the rows were at one length)
    original = TracedSteps.step
    monkeypatch.setattr(TracedSteps, "step", lambda self, cache, tokens: (
        traced_steps.append(("target" if self.model is target else "draft", *tokens.shape, cache.aligned)),
        original(self, cache, tokens))[1])
    for batch in (1, 3):
        traced_steps.clear()
        idx = prompts(batch, 5, 2)
        no_stop = SamplingParams(max_new_tokens=16, temperature=0, stop_at_eot=False)
        expected = generate(target, idx, no_stop, decode="dynamic")
        assert torch.equal(generate(target, idx, no_stop, draft=draft, draft_tokens=3), expected)
        # The target checks the 3 proposals and the token before them in one traced pass, to the end (its cache
        # has room for a whole step); the draft steps one token at a time, two when it catches up.
        assert {width for model, _, width, _ in traced_steps if model == "target"} == {4}
        assert {width for model, _, width, _ in traced_steps if model == "draft"} <= {1, 2}
        assert max(rows for _, rows, _, _ in traced_steps) == batch  # fewer once rows reach the end
        if batch > 1:  # rows that kept different counts are traced at their own lengths
            assert {aligned for *_, aligned in traced_steps} == {True, False}
    traced_steps.clear()
    assert torch.equal(generate(target, idx, no_stop, draft=draft, draft_tokens=3, decode="dynamic"), expected)
    assert not traced_steps  # dynamic: every pass eager
