import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from model.config import GPTConfig, preset
from decode.generate import generate
from model.gpt import GPT
from model.kv_cache import KVCache, StaticKVCache
from decode.sampling import SamplingParams, filter_logits
from tests.conftest import small_config


@pytest.mark.parametrize("name, hf_count", [("gpt2", 124_439_808), ("gpt2-medium", 354_823_168)])
def test_parameter_counts_match_hugging_face(name, hf_count):
    with torch.device("meta"):
        model = GPT(preset(name))
    assert model.num_parameters(padded_vocab=False) == hf_count
    padding = (model.config.padded_vocab_size - 50257) * model.config.n_embd
    assert model.num_parameters() == hf_count + padding


def test_unknown_preset_names_the_choices():
    with pytest.raises(ValueError, match="unknown model preset 'gpt5'.*gpt2-medium"):
        preset("gpt5")


def test_config_rejects_mismatched_widths():
    with pytest.raises(ValueError, match="mlp_hidden has 1 entries but the model has 2 layers"):
        small_config(mlp_hidden=[64])
    with pytest.raises(ValueError, match="not divisible"):
        GPTConfig(n_embd=30, n_head=4)


def test_weights_are_tied(small_model):
    assert small_model.lm_head.weight is small_model.transformer.wte.weight


def test_future_tokens_never_change_earlier_logits(small_model):
    idx = torch.randint(0, 50257, (2, 16))
    changed = idx.clone()
    changed[:, 10:] = torch.randint(0, 50257, (2, 6))
    a, _ = small_model(idx)
    b, _ = small_model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_padded_vocabulary_never_reaches_logits(small_model):
    logits, _ = small_model(torch.randint(0, 50257, (1, 4)))
    assert logits.shape[-1] == 50257


def test_loss_is_cross_entropy_of_logits(small_model):
    idx, targets = torch.randint(0, 50257, (2, 8)), torch.randint(0, 50257, (2, 8))
    logits, loss = small_model(idx, targets)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 50257), targets.reshape(-1))
    torch.testing.assert_close(loss, expected)


def test_the_evaluation_loss_over_several_chunks_with_ignored_targets_is_cross_entropy_of_the_logits():
    """Without gradients the loss is computed a chunk of rows at a time (model/head_loss.py): three chunks here,
    one of them ending part-way, and targets -1 ignored as training's are."""
    from model.head_loss import ROWS_PER_CHUNK
    torch.manual_seed(0)
    model = GPT(small_config(block_size=ROWS_PER_CHUNK)).eval()
    idx = torch.randint(0, 50257, (3, ROWS_PER_CHUNK - 40))
    targets = torch.randint(0, 50257, idx.shape)
    targets[1, 10:] = -1
    with torch.no_grad():
        logits, loss = model(idx, targets)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 50257), targets.reshape(-1), ignore_index=-1)
    torch.testing.assert_close(loss, expected)


def test_kv_cache_greedy_equals_uncached_greedy(small_model):
    prompt = torch.randint(0, 50257, (3, 5))
    params = SamplingParams(max_new_tokens=20, temperature=0, stop_at_eot=False)
    cached = generate(small_model, prompt, params, use_cache=True, decode="dynamic")
    uncached = generate(small_model, prompt, params, use_cache=False)
    assert torch.equal(cached, uncached)
    assert cached.shape == (3, 25)
    # The fixed-shape cache a CUDA graph replays (every slot attended through a mask) gives the same tokens,
    # and the same logits within float rounding.
    assert torch.equal(generate(small_model, prompt, params, decode="static"), cached)


def test_static_cache_step_equals_dynamic_step_and_advances_on_the_device(small_model):
    prompt, tokens = torch.randint(0, 50257, (2, 6)), torch.randint(0, 50257, (2, 2))
    logits = {}
    for cache_type in (KVCache, StaticKVCache):
        cache = cache_type.allocate(small_model.config, 2, 16, "cpu")
        with torch.no_grad():
            small_model(prompt, cache=cache)
            aligned = small_model(tokens[:, :1], cache=cache, last_only=True)[0]
            cache.truncate(torch.tensor([7, 4]))  # rows at their own lengths, as speculative decoding leaves them
            ragged = small_model(tokens, cache=cache)[0]
        logits[cache_type] = aligned, ragged
        assert cache.length == 9 and cache.lengths.tolist() == [9, 6]
    for static, dynamic in zip(logits[StaticKVCache], logits[KVCache]):
        torch.testing.assert_close(static, dynamic, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="'cuda-graph' needs a CUDA device"):
        generate(small_model, prompt, SamplingParams(max_new_tokens=2, temperature=0), decode="cuda-graph")


def test_seeded_sampling_is_reproducible(small_model):
    prompt = torch.randint(0, 50257, (2, 4))
    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_k=50, top_p=0.9, seed=7, stop_at_eot=False)
    assert torch.equal(generate(small_model, prompt, params), generate(small_model, prompt, params))


def test_rows_of_different_lengths_in_one_cache_match_single_sequences(small_model):
    """Rows at their own lengths in one KVCache (the server's running batch) give each row's own logits."""
    short, long = torch.randint(0, 50257, (3,)), torch.randint(0, 50257, (7,))
    cache = KVCache.allocate(small_model.config, 2, 10, "cpu")
    small_model(torch.stack([torch.cat([short, long[3:]]), long]), cache=cache)
    cache.truncate(torch.tensor([3, 7]))  # row 0 holds the short prompt alone
    nxt = torch.randint(0, 50257, (2, 2))
    step, _ = small_model(nxt, cache=cache)
    assert cache.lengths.tolist() == [5, 9]
    ref_short, _ = small_model(torch.cat([short, nxt[0]])[None])
    ref_long, _ = small_model(torch.cat([long, nxt[1]])[None])
    torch.testing.assert_close(step[0], ref_short[0, -2:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step[1], ref_long[0, -2:], atol=1e-5, rtol=1e-5)


def test_top_k_and_top_p_filtering():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = filter_logits(logits, 1.0, top_k=2, top_p=None).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    kept = filter_logits(logits, 1.0, top_k=None, top_p=0.7).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    kept = filter_logits(logits, 1.0, top_k=None, top_p=0.1).isfinite()
    assert kept.tolist() == [[True, False, False, False]]


def test_generation_refuses_to_overrun_context(small_model):
    with pytest.raises(ValueError, match="exceeds the model's context of 64"):
        generate(small_model, torch.zeros(1, 60, dtype=torch.long), SamplingParams(max_new_tokens=10))


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = GPT(small_config())
    checkpointed = GPT(small_config())
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.gradient_checkpointing = True
    idx, targets = torch.randint(0, 50257, (2, 16)), torch.randint(0, 50257, (2, 16))
    for model in (plain, checkpointed):
        model.train()
        model(idx, targets)[1].backward()
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_fused_head_loss_equals_the_plain_head_and_cross_entropy():
    """Training's fused head + loss and evaluation's chunked loss give the plain path's loss and gradients,
    over the real vocabulary only (the padded columns get no probability and no gradient)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=128))  # vocabulary padded to 50304
    idx = torch.randint(0, 50257, (3, 100))  # 300 rows: the last chunk of 256 is partial
    targets = torch.randint(0, 50257, (3, 100))
    targets[0, :7] = -1

    def plain():
        logits = model.lm_head(model.hidden_states(idx))[..., :50257]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 50257), targets.reshape(-1), ignore_index=-1)

    model.train()
    expected = plain()
    expected.backward()
    expected_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logits, fused = model(idx, targets)
    fused.backward()
    assert logits is None and fused.item() == pytest.approx(expected.item(), rel=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected_grads[name], rtol=1e-4, atol=1e-7)
    assert p.grad is not None and not model.transformer.wte.weight.grad[50257:].any()
    with torch.no_grad():
        assert model.eval()(idx, targets)[1].item() == pytest.approx(expected.item(), rel=1e-6)


def test_training_off_the_cpu_takes_the_plain_head_and_loss():
    """The fused head + loss is the CPU's: on another device (meta here, standing in for CUDA) training returns the
    logits of the plain head with `F.cross_entropy`'s loss, which torch.compile fuses there."""
    with torch.device("meta"):
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32)).train()
        idx = torch.zeros(2, 8, dtype=torch.long)
    logits, loss = model(idx, idx)
    assert logits is not None and logits.shape == (2, 8, 50257) and loss.shape == ()


def test_model_package_has_no_import_cycle():
    """model/ imports top-down only (no module reaches itself through others) and nothing downstream of it
    (storage/ included: the artifact layer builds models, never the reverse)."""
    import ast
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "model"
    imports, packages = {}, set()
    for path in root.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):  # every import, also those inside functions
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for module in modules:
                packages.add(module.split(".")[0])
                if module.startswith("model."):
                    names.add(module.removeprefix("model."))
        imports[path.stem] = names

    def reaches(start, target, seen=()):
        return any(n == target or (n not in seen and reaches(n, target, (*seen, n))) for n in imports.get(start, ()))
    assert not [m for m in imports if reaches(m, m)]
    assert not packages & {"storage", "parallel", "training", "train", "serve", "prune", "quantize", "bench", "sample"}


@pytest.mark.parametrize("fill", [float("nan"), float("inf"), float("-inf"), 3e38])
@pytest.mark.parametrize("settings", [dict(temperature=7.3e-39), dict(temperature=1.0), dict(temperature=0.7, top_k=5),
                                      dict(temperature=1.0, top_p=1e-300), dict(temperature=2.0, top_p=0.5)])
def test_sampler_never_leaves_the_vocabulary(fill, settings):
    from decode.sampling import row_generators, sample_rows
    logits = torch.randn(3, 50257)
    logits[0] = fill  # a whole row of it
    logits[1, ::7] = fill  # some of it
    params = SamplingParams(**settings)
    tokens = sample_rows(logits, [params] * 3, row_generators(0, 3, "cpu"))
    assert all(0 <= t < 50257 for t in tokens)


SPECIAL_LOGITS = [0.0, 1.0, -1.0, 2.5, float("nan"), float("inf"), float("-inf"), torch.finfo(torch.float32).max]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@given(values=st.lists(st.sampled_from(SPECIAL_LOGITS), min_size=4 * 6, max_size=4 * 6),
       greedy=st.lists(st.booleans(), min_size=4, max_size=4))
@settings(max_examples=200, deadline=None)
def test_greedy_tokens_are_the_argmax_of_the_cleaned_logits_whatever_they_hold(values, greedy, dtype):
    """Greedy rows read the logits as they are when every row's best is finite, and clean them (NaN to -inf,
    +inf to the largest float) otherwise: either way, the first best of the cleaned logits, in a batch alone or
    beside sampled rows, whichever reduction reads them (numpy's for float32 and float64 on the CPU, torch's for
    the rest), and from a strided view of a pass's logits as from a tensor of its own."""
    from decode.sampling import row_generators, sample_rows
    logits = torch.tensor(values).view(4, 6).to(dtype)
    params = [SamplingParams(temperature=0.0 if g else 1.0) for g in greedy]
    cleaned = torch.nan_to_num(logits.float(), nan=float("-inf"), posinf=torch.finfo(torch.float32).max)
    expected = [int(cleaned[row].argmax()) for row in range(4) if greedy[row]]
    last_positions = torch.zeros(4, 3, 6, dtype=dtype)
    last_positions[:, -1] = logits  # logits[:, -1] of a (rows, positions, vocab) pass: a view with strides
    for handed in (logits, last_positions[:, -1]):
        tokens = sample_rows(handed, params, row_generators(0, 4, "cpu"))
        assert [t for t, g in zip(tokens, greedy) if g] == expected


@pytest.mark.parametrize("settings, message", [(dict(temperature=float("nan")), "temperature must be a finite"),
                                               (dict(temperature=-1), "temperature must be a finite"),
                                               (dict(top_p=0.0), "top_p must be in"),
                                               (dict(top_p=float("nan")), "top_p must be in")])
def test_undefined_sampling_settings_are_refused(settings, message):
    from decode.sampling import SamplingError
    with pytest.raises(SamplingError, match=message):
        SamplingParams(**settings)


def test_each_row_draws_the_token_whose_interval_holds_its_own_uniform():
    """The batched draw is inverse-CDF sampling per row, each row with one uniform from its own generator."""
    from decode.sampling import row_generators, sample_rows
    torch.manual_seed(0)
    logits = torch.randn(5, 300) * 4
    tokens = sample_rows(logits, [SamplingParams(temperature=1.0)] * 5, row_generators(7, 5, "cpu"))
    for row, generator in enumerate(row_generators(7, 5, "cpu")):
        u = torch.rand((), dtype=torch.float64, generator=generator)
        cdf = (logits[row] - logits[row].max()).softmax(-1).double().cumsum(-1)
        assert tokens[row] == int(torch.searchsorted(cdf, u * cdf[-1], right=True))
