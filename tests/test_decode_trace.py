"""decode/trace.py: traced decode steps give the eager steps' tokens (fp32 packed and plain, int8), one
trace serves every length for a batch size, and weights changed in place are traced anew."""
from __future__ import annotations

import copy

import pytest
import torch

import decode.trace
from runtime import huge_pages
import decode.trace_payback
from decode.steps import DecodeSteps, fastest_decode
from decode.trace import _RECORDS, TracedSteps
from decode.trace_payback import TracePayback
from decode.generate import generate
from tests.scripted_host import quiet_host
from model.kv_cache import ContextOverflow, KVCache
from model.int8 import quantize_model
from model import packed_linear
from model.kernel_choice import KernelChoices
from model.packed_linear import PackedLinear, pack_for_inference
from decode.sampling import SamplingParams

GREEDY = SamplingParams(max_new_tokens=12, temperature=0, stop_at_eot=False)
SAMPLED = SamplingParams(max_new_tokens=12, temperature=0.9, top_k=40, seed=5, stop_at_eot=False)


def prompt(batch=2, length=5):
    return torch.randint(0, 50257, (batch, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("packed", [True, False])
def test_traced_steps_give_the_eager_tokens_and_one_trace_serves_every_length(small_model, packed):
    if packed:
        pack_for_inference(small_model)
    for params in (GREEDY, SAMPLED):
        assert torch.equal(generate(small_model, prompt(), params, decode="traced"),
                           generate(small_model, prompt(), params, decode="dynamic"))
    traced, = _RECORDS[small_model].traces.values()
    longer = SamplingParams(max_new_tokens=40, temperature=0, stop_at_eot=False)
    assert torch.equal(generate(small_model, prompt(length=9), longer, decode="traced"),
                       generate(small_model, prompt(length=9), longer, decode="dynamic"))
    assert list(_RECORDS[small_model].traces.values()) == [traced]
    generate(small_model, prompt(batch=3), GREEDY, decode="traced")
    assert len(_RECORDS[small_model].traces) == 2


@pytest.mark.parametrize("weights", ["fp32", "int8"])
def test_a_traced_step_reads_no_sizes_as_it_runs(small_model, weights):
    # Each size read in the graph is a node the interpreter runs at every step (and a scalar tensor for each); the
    # trace's shapes are its own constants, and the cache is written at its last columns counted from the end.
    if weights == "int8":
        quantize_model(small_model, head="int8")
    pack_for_inference(small_model)
    generate(small_model, prompt(), GREEDY, decode="traced")
    traced, = _RECORDS[small_model].traces.values()
    kinds = {node.kind() for node in traced.inlined_graph.nodes()}
    assert not kinds & {"aten::size", "prim::NumToTensor", "aten::Int", "aten::neg"}, sorted(kinds)


def test_the_default_decode_on_the_cpu_traces_packed_products_and_leaves_the_model_as_it_was(small_model,
                                                                                             monkeypatch):
    # a trace guessed free until timed: these calls trace once an eager step is timed
    monkeypatch.setattr(decode.trace_payback, "PAYBACK", TracePayback(load=quiet_host(), guess=(0.0, 0.5)))
    eager = copy.deepcopy(small_model)
    for params in (GREEDY, SAMPLED):
        assert torch.equal(generate(small_model, prompt(), params), generate(eager, prompt(), params, decode="dynamic"))
    traced, = _RECORDS[small_model].traces.values()
    # its products run through the kernels timed fastest on this host (which one is the host's: the test of the
    # kernel choice below pins each with a fake clock)
    graph = str(traced.inlined_graph)
    assert any(op in graph for op in ("mkldnn::_linear_pointwise", "aten::addmm", "aten::linear", "aten::baddbmm"))
    assert eager not in _RECORDS
    assert not any(isinstance(m, PackedLinear) for m in small_model.modules())  # nn.Linear, as the caller made it
    assert fastest_decode(small_model, torch.device("cpu")) == "traced"
    assert fastest_decode(small_model, torch.device("cuda")) == "cuda-graph"


def test_a_traced_step_of_several_tokens_gives_the_eager_pass_and_fills_the_same_cache(small_model):
    # Speculative decoding's verification: a few tokens per row after a prompt, attending causally among themselves.
    pack_for_inference(small_model)
    eager_cache, traced_cache = (KVCache.allocate(small_model.config, 2, 16, "cpu") for _ in range(2))
    tokens = prompt(length=3)
    with torch.inference_mode():
        for cache in (eager_cache, traced_cache):
            small_model(prompt(), cache=cache)
        expected = small_model(tokens, cache=eager_cache)[0]
        got = TracedSteps(small_model).step(traced_cache, tokens)
    assert got.shape == expected.shape == (2, 3, small_model.config.vocab_size)
    assert torch.allclose(got, expected, atol=1e-4)
    assert traced_cache.length == eager_cache.length == 8
    for traced, eager in zip(traced_cache.k + traced_cache.v, eager_cache.k + eager_cache.v):
        assert torch.allclose(traced[:, :, :8], eager[:, :, :8], atol=1e-5)


def test_at_most_the_kept_traces_are_kept_the_oldest_going_first(small_model):
    pack_for_inference(small_model)
    steps = TracedSteps(small_model, kept=2)
    cache = KVCache.allocate(small_model.config, 3, 4, "cpu")
    with torch.inference_mode():
        for rows in (1, 2, 3):
            tokens = torch.zeros(rows, 1, dtype=torch.long)
            steps(tokens, tokens, None, [k[:rows, :, :1] for k in cache.k], [v[:rows, :, :1] for v in cache.v])
    assert [key[0] for key in steps.traces] == [2, 3]


def test_a_trace_made_while_a_step_runs_on_one_thread_is_made_for_every_thread(small_model, monkeypatch):
    # decode/step_threads.py runs a step on fewer threads beside a busy program; a trace made
    # on such a step kept that count's kernels and weight blocks for every step after it, on every thread
    monkeypatch.setattr(packed_linear, "CHOICES", KernelChoices(load=quiet_host()))
    pack_for_inference(small_model)
    before = torch.get_num_threads()
    cache = KVCache.allocate(small_model.config, 1, 8, "cpu")
    try:
        torch.set_num_threads(1)
        with torch.inference_mode():
            small_model(prompt(batch=1), cache=cache)
            TracedSteps(small_model, threads=2).step(cache, torch.zeros(1, 1, dtype=torch.long))
        assert torch.get_num_threads() == 1  # the step's own count, as it was
    finally:
        torch.set_num_threads(before)
    chosen = packed_linear.CHOICES.chosen
    assert chosen and {threads for *_, threads in chosen} == {2}


def test_the_steps_trace_with_the_thread_count_they_were_made_with(small_model):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert DecodeSteps(small_model, torch.device("cpu"), "traced").traced.threads == 2
    finally:
        torch.set_num_threads(before)


def test_an_int8_model_traces_to_the_same_tokens_as_its_eager_steps(small_model):
    quantize_model(small_model, head="int8")
    pack_for_inference(small_model)
    for params in (GREEDY, SAMPLED):
        assert torch.equal(generate(small_model, prompt(), params, decode="traced"),
                           generate(small_model, prompt(), params, decode="dynamic"))


def test_weights_changed_in_place_are_traced_anew(small_model):
    pack_for_inference(small_model)
    generate(small_model, prompt(), GREEDY, decode="traced")
    other = copy.deepcopy(small_model.state_dict())
    torch.manual_seed(7)
    for t in other.values():
        t.normal_(0, 0.05)
    small_model.load_state_dict(other)
    old_weights = _RECORDS[small_model].weights
    assert torch.equal(generate(small_model, prompt(), GREEDY, decode="traced"),
                       generate(small_model, prompt(), GREEDY, decode="dynamic"))
    assert _RECORDS[small_model].weights != old_weights and len(_RECORDS[small_model].traces) == 1


def test_weights_are_moved_onto_huge_pages_once_per_set_after_enough_traced_steps(small_model, monkeypatch):
    passes = []
    monkeypatch.setattr(huge_pages, "collapse_in_background", lambda: passes.append(1) or "asked")
    monkeypatch.setattr(huge_pages, "passes_asked", lambda: len(passes))
    steps = GREEDY.max_new_tokens - 1  # traced steps per call: the prompt's pass makes the first token
    monkeypatch.setattr(decode.trace, "HUGE_PAGES_AFTER_STEPS", 2 * steps + 1)
    pack_for_inference(small_model)
    for rows in (1, 2):  # a one-off call ends before the pass would repay it: none yet
        generate(small_model, prompt(batch=rows), GREEDY, decode="traced")
    assert passes == []
    for rows in (3, 1):  # steps of every row count add up; later traces share the packed copies: one pass
        generate(small_model, prompt(batch=rows), GREEDY, decode="traced")
    assert len(passes) == 1
    with torch.no_grad():
        small_model.lm_head.weight.mul_(2)  # new weights, packed anew at their first trace: counted afresh
    generate(small_model, prompt(), GREEDY, decode="traced")
    assert len(passes) == 1
    for _ in range(2):
        generate(small_model, prompt(), GREEDY, decode="traced")
    assert len(passes) == 2
    with torch.no_grad():
        small_model.lm_head.weight.mul_(2)
    generate(small_model, prompt(), GREEDY, decode="traced")
    huge_pages.collapse_in_background()  # asked for since these weights' first traced step (a server's warm-up)
    for _ in range(2):
        generate(small_model, prompt(), GREEDY, decode="traced")
    assert len(passes) == 3  # that one alone: the steps do not ask again
    with torch.no_grad():
        small_model.lm_head.weight.mul_(2)
    TracedSteps(small_model)  # a call under auto that has not traced yet, then a benchmark's warm-up asks
    huge_pages.collapse_in_background()
    for _ in range(3):
        generate(small_model, prompt(), GREEDY, decode="traced")
    assert len(passes) == 4


def test_a_replaced_weight_is_traced_anew(small_model):
    pack_for_inference(small_model)
    generate(small_model, prompt(), GREEDY, decode="traced")
    torch.manual_seed(3)
    block = small_model.transformer.h[0].mlp.c_fc
    block.weight = torch.nn.Parameter(torch.randn_like(block.weight) * 0.5)  # a new tensor, not an in-place change
    x = torch.randn(3, block.in_features)
    with torch.inference_mode():  # the packed copy follows the new weight
        torch.testing.assert_close(block(x), torch.nn.functional.linear(x, block.weight, block.bias))
    assert torch.equal(generate(small_model, prompt(), GREEDY, decode="traced"),
                       generate(small_model, prompt(), GREEDY, decode="dynamic"))


def test_a_step_past_the_cache_is_refused(small_model):
    cache = KVCache.allocate(small_model.config, 1, 4, "cpu")
    with torch.inference_mode():
        small_model(prompt(batch=1, length=4), cache=cache, last_only=True)
        with pytest.raises(ContextOverflow, match="KV cache holds 4 positions; 5 requested"):
            DecodeSteps(small_model, torch.device("cpu"), "traced").logits(cache, torch.zeros(1, 1, dtype=torch.long), 1)


@pytest.mark.parametrize("fastest, op", [("transposed", "aten::addmm"), ("onednn", "mkldnn::_linear_pointwise"),
                                         ("linear", "aten::linear")])
def test_a_trace_multiplies_through_the_kernel_timed_fastest_for_its_shapes(small_model, monkeypatch, fastest, op):
    clock = type("Clock", (), {"now": 0.0, "__call__": lambda self: self.now})()
    monkeypatch.setattr(packed_linear, "CHOICES", KernelChoices(load=quiet_host(), clock=clock))
    real_product = packed_linear.product

    def timed_product(kernel, *args):
        clock.now += 1.0 if kernel == fastest else 2.0
        return real_product(kernel, *args)

    monkeypatch.setattr(packed_linear, "product", timed_product)
    for params in (GREEDY, SAMPLED):
        assert torch.equal(generate(small_model, prompt(), params, decode="traced"),
                           generate(small_model, prompt(), params, decode="dynamic"))
    traced, = _RECORDS[small_model].traces.values()
    graph = str(traced.inlined_graph)
    assert op in graph and all(kernel == fastest for kernel in packed_linear.CHOICES.chosen.values())
    others = {"aten::addmm", "mkldnn::_linear_pointwise", "aten::linear", "aten::baddbmm"} - {op}
    assert not any(other in graph for other in others)


def test_a_trace_keeps_the_default_kernels_where_its_step_ran_slower_with_those_timed_fastest_alone(small_model,
                                                                                                    monkeypatch):
    # `transposed` wins every product timed alone, and makes the whole step slower: the step confirms the defaults
    clock = type("Clock", (), {"now": 0.0, "__call__": lambda self: self.now})()
    monkeypatch.setattr(packed_linear, "CHOICES", KernelChoices(load=quiet_host(), clock=clock))
    real_over, real_product, alone = packed_linear._over, packed_linear.product, []

    def timed_alone(kernel, *args):
        alone.append(kernel)
        try:
            real_over(kernel, *args)
        finally:
            alone.pop()
        clock.now += 1.0 if kernel == "transposed" else 2.0

    def timed_in_a_step(kernel, *args):
        if not alone:
            clock.now += 3.0 if kernel == "transposed" else 1.0
        return real_product(kernel, *args)

    monkeypatch.setattr(packed_linear, "_over", timed_alone)
    monkeypatch.setattr(packed_linear, "product", timed_in_a_step)
    assert torch.equal(generate(small_model, prompt(), GREEDY, decode="traced"),
                       generate(small_model, prompt(), GREEDY, decode="dynamic"))
    chosen = packed_linear.CHOICES.chosen
    assert chosen and all(kernel == packed_linear.default_kernel(shape[0], shape[2], shape[-1])
                          for shape, kernel in chosen.items())
    traced, = _RECORDS[small_model].traces.values()
    assert "aten::addmm" not in str(traced.inlined_graph)  # no product through a transposed copy
