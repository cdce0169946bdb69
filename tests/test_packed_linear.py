"""model/packed_linear.py: the oneDNN-packed linear computes nn.Linear's product, follows weights changed in
place, keeps gradients on the plain product, and a packed model decodes the unpacked model's tokens."""
from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn as nn

from decode.generate import generate
from tests.scripted_host import ScriptedHost, quiet_host
from model.gpt import GPT
from model.int8 import Int8Linear, quantize_model
from model import packed_linear
from model.kernel_choice import KernelChoices, host_key, kept_choices
from model.packed_linear import (KERNELS, PACKED, PackedLinear, choosing_kernels, default_kernel, pack_for_inference,
                                 product, weight_form)
from decode.sampling import SamplingParams
from tests.conftest import small_config

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this PyTorch has no oneDNN")


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 48), (12, 48), (2, 5, 48)])
@pytest.mark.parametrize("kernel", KERNELS)
def test_every_kernel_computes_nn_linears_product(bias, shape, kernel):
    torch.manual_seed(0)
    linear = nn.Linear(48, 80, bias=bias)
    x = torch.randn(shape)
    with torch.inference_mode():
        torch.testing.assert_close(product(kernel, x, linear.weight, linear.bias, 2), linear(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(PackedLinear(linear)(x), linear(x), rtol=1e-5, atol=1e-5)


def test_a_shape_not_timed_runs_the_default_rule():
    """One row (a decoding step at batch 1): one block of weight rows per thread, when the threads divide the
    rows; else, and for more rows, oneDNN's product."""
    assert default_kernel(1, 80, 2) == "blocked"
    assert default_kernel(1, 81, 2) == "onednn" and default_kernel(1, 80, 1) == "onednn"
    assert default_kernel(3, 80, 2) == "onednn"


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_chooser_keeps_the_fastest_candidate_per_shape_and_times_each_shape_once():
    clock = FakeClock()
    choices = KernelChoices(load=quiet_host(), clock=clock, rounds=3)
    calls = []
    # b is slower than a in its warm-up (a first call's one-time work) and once more; its fastest round wins
    costs = {"a": [5.0, 2.0, 2.0, 2.0], "b": [9.0, 1.5, 3.0, 1.5]}

    def run(name):
        calls.append(name)
        clock.now += costs[name].pop(0)

    candidates = lambda: {name: (lambda name=name: run(name)) for name in costs}
    assert choices.choose((1, 8, 8), candidates) == "b"
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # a warm-up round, then turns reversed every other
    assert choices.timings[(1, 8, 8)] == {"a": 2.0, "b": 1.5}
    calls.clear()
    assert choices.choose((1, 8, 8), lambda: pytest.fail("a chosen shape is not timed again")) == "b"
    costs = {"a": [1.0] * 4, "b": [2.0] * 4}
    assert choices.choose((4, 8, 8), candidates) == "a" and len(calls) == 8  # another shape: timed on its own
    with pytest.raises(ValueError, match="no kernel candidates"):
        choices.choose((12, 8, 8), dict)


def test_a_choice_is_kept_for_the_next_process_which_takes_it_untimed(tmp_path):
    path = tmp_path / "choices.json"
    clock = FakeClock()
    costs = {"a": 2.0, "b": 1.0}

    def candidates():
        return {name: (lambda name=name: setattr(clock, "now", clock.now + costs[name])) for name in costs}

    first = KernelChoices(load=quiet_host(), clock=clock, kept=kept_choices(path))
    assert first.choose((1, 8, 8), candidates) == "b"
    assert kept_choices(path).read() == {}  # not yet judged in a step: a process stopped here keeps nothing
    assert first.confirm(lambda: None, lambda shape: "b") == {(1, 8, 8): "b"}  # the default: nothing to judge
    assert kept_choices(path).read() == {host_key((1, 8, 8)): "b"}
    later = KernelChoices(load=quiet_host(), clock=lambda: pytest.fail("a kept choice is not timed again"), kept=kept_choices(path))
    assert later.choose((1, 8, 8), candidates) == "b"
    assert later.timings == {}  # taken from the file, not measured here
    costs = {"a": 1.0, "c": 2.0}  # b is no longer a candidate (another version's kernels): timed again, replaced
    again = KernelChoices(load=quiet_host(), clock=clock, kept=kept_choices(path))
    assert again.choose((1, 8, 8), candidates) == "a" and set(again.timings[(1, 8, 8)]) == {"a", "c"}
    assert kept_choices(path).read() == {host_key((1, 8, 8)): "b"}  # until the step has judged it
    again.confirm(lambda: None, lambda shape: "a")
    assert kept_choices(path).read() == {host_key((1, 8, 8)): "a"}
    assert KernelChoices(load=quiet_host(), clock=clock, kept=kept_choices(None)).choose((1, 8, 8), candidates) == "a"  # off
    assert [p.name for p in tmp_path.iterdir()] == ["choices.json"]


def scripted_choices(path):
    """Kernel choices on a scripted host, between a kernel `a` that costs 2 s and `b` that costs 1 s: the host,
    the choices, and the candidates' timers."""
    host = ScriptedHost()
    clock = host.clock
    choices = KernelChoices(load=host.load, clock=clock, kept=kept_choices(path))
    costs = {"a": 2.0, "b": 1.0}
    candidates = lambda: {name: (lambda name=name: setattr(clock, "now", clock.now + costs[name])) for name in costs}
    return host, choices, candidates


def test_quiet_then_busy_then_quiet_keeps_only_the_quiet_choices_and_a_busy_one_runs_the_default(tmp_path):
    # Under load b looks fastest (the timing says more of the load than of b); quiet, b is fastest too, and the step
    # with it as well.  Only the quiet shapes are kept; the busy one runs the default rule's a, in this process too.
    path = tmp_path / "choices.json"
    host, choices, candidates = scripted_choices(path)
    clock = host.clock

    def step(shape):  # the step of `shape` runs faster with b
        return lambda: setattr(clock, "now", clock.now + (1.0 if choices.chosen[shape] == "b" else 2.0))
    assert choices.choose((1, 8, 8), candidates) == "b"
    assert choices.confirm(step((1, 8, 8)), lambda shape: "a") == {(1, 8, 8): "b"}
    host.others = 1.0  # another program takes a core
    clock.now += 1.0
    assert choices.choose((4, 8, 8), candidates) == "b"
    assert choices.confirm(step((4, 8, 8)), lambda shape: "a") == {(4, 8, 8): "a"}
    assert choices.chosen[(4, 8, 8)] == "a"
    host.others = 0.0
    clock.now += 1.0
    assert choices.choose((12, 8, 8), candidates) == "b"
    assert choices.confirm(step((12, 8, 8)), lambda shape: "a") == {(12, 8, 8): "b"}
    assert kept_choices(path).read() == {host_key((1, 8, 8)): "b", host_key((12, 8, 8)): "b"}


def test_a_step_confirmed_while_the_host_turned_busy_runs_the_defaults_and_keeps_nothing(tmp_path):
    path = tmp_path / "choices.json"
    host, choices, candidates = scripted_choices(path)
    clock = host.clock

    def step():  # faster with b, but the load starts while the step is timed
        host.others = 2.0
        clock.now += 1.0 if choices.chosen[(1, 8, 8)] == "b" else 2.0
    assert choices.choose((1, 8, 8), candidates) == "b"
    assert choices.confirm(step, lambda shape: "a") == {(1, 8, 8): "a"}
    assert kept_choices(path).read() == {}


@pytest.mark.parametrize("step_with_b, kept", [(3.0, "a"), (1.0, "b")])
def test_a_kernel_faster_alone_is_kept_only_if_the_whole_step_runs_faster_with_it(tmp_path, step_with_b, kept):
    # b wins alone at two shapes; the step takes 2.0 with the default a at both, and step_with_b with b at both
    path, clock = tmp_path / "choices.json", FakeClock()
    choices = KernelChoices(load=quiet_host(), clock=clock, kept=kept_choices(path))
    costs = {"a": 2.0, "b": 1.0}
    candidates = lambda: {name: (lambda name=name: setattr(clock, "now", clock.now + costs[name])) for name in costs}
    shapes = [(4, 8, 8), (4, 8, 16)]
    assert [choices.choose(shape, candidates) for shape in shapes] == ["b", "b"]
    assert kept_choices(path).read() == {}  # nothing kept before the step has judged the choices
    steps = []

    def step():
        kernels = {choices.chosen[shape] for shape in shapes}
        assert len(kernels) == 1  # the step runs with all of the timed kernels, or with none
        steps.append(kernels.pop())
        clock.now += step_with_b if steps[-1] == "b" else 2.0

    assert choices.confirm(step, lambda shape: "a") == {shape: kept for shape in shapes}
    assert {choices.chosen[shape] for shape in shapes} == {kept}
    assert kept_choices(path).read() == {host_key(shape): kept for shape in shapes}
    assert steps.count("a") == steps.count("b") == choices.rounds + 1  # in turns, a warm-up round first
    steps.clear()
    assert choices.confirm(step, lambda shape: "a") == {} and steps == []  # nothing timed since: nothing to judge
    choices.choose((1, 8, 8), candidates)
    assert choices.confirm(step, lambda shape: "b") == {(1, 8, 8): "b"} and steps == []  # the default won alone
    assert kept_choices(path).read()[host_key((1, 8, 8))] == "b"


def test_the_key_holds_the_cpu_torch_the_whole_shape_and_that_choices_are_confirmed_in_a_step():
    key = host_key((1, 768, 2304, True, 2))
    assert torch.__version__ in key and key.endswith("(1, 768, 2304, True, 2) | confirmed in a step on a quiet host")
    assert host_key((1, 768, 2304, True, 1)) != key


@needs_onednn
def test_a_layer_times_the_candidates_only_while_choosing_and_keeps_only_the_chosen_kernels_copies(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(packed_linear, "CHOICES", KernelChoices(load=quiet_host(), clock=clock))
    real_product = packed_linear.product
    speed = {"transposed": 1.0}  # the fastest on this fake host; every other kernel takes 2 s

    def timed_product(kernel, *args):
        clock.now += speed.get(kernel, 2.0)
        return real_product(kernel, *args)

    monkeypatch.setattr(packed_linear, "product", timed_product)
    torch.manual_seed(0)
    linears = [nn.Linear(48, 80) for _ in range(3)]
    layers = [PackedLinear(linear) for linear in linears]
    x = torch.randn(4, 48)
    threads = torch.get_num_threads()
    with torch.inference_mode():
        torch.testing.assert_close(layers[0](x), linears[0](x), rtol=1e-5, atol=1e-5)  # not choosing: the default
        assert packed_linear.CHOICES.chosen == {}
        with choosing_kernels():
            torch.testing.assert_close(layers[0](x), linears[0](x), rtol=1e-5, atol=1e-5)
    shape = (4, 48, 80, True, threads)
    assert packed_linear.CHOICES.chosen == {shape: "transposed"}
    fitting = KERNELS if threads > 1 else ("onednn", "linear", "transposed")
    assert set(packed_linear.CHOICES.timings[shape]) == set(fitting)
    for layer in layers:  # timed over the three layers' weights; the copies no chosen kernel reads are freed
        assert [tuple(f.shape) for f in layer.forms() if f.layout == torch.strided] == [(48, 80)]


@needs_onednn
def test_an_eager_product_runs_the_kernel_an_earlier_trace_kept_for_its_shape_untimed(monkeypatch, tmp_path):
    """Outside a trace's choosing, a shape this process has not timed runs what the kept file names for it, where the
    layer can run that kernel, and the default rule otherwise; nothing is timed."""
    threads = torch.get_num_threads()
    path = tmp_path / "choices.json"
    kept = {host_key((4, 48, 80, True, threads)): "transposed",  # runnable: taken
            host_key((4, 48, 81, True, threads)): "blocked" if threads > 1 else "no such kernel"}  # 81 rows: not
    path.write_text(json.dumps(kept))
    untimed = KernelChoices(load=quiet_host(), clock=lambda: pytest.fail("an eager product timed kernels"), kept=kept_choices(path))
    monkeypatch.setattr(packed_linear, "CHOICES", untimed)
    ran = []
    real_product = packed_linear.product

    def recorded(kernel, *args):
        ran.append(kernel)
        return real_product(kernel, *args)

    monkeypatch.setattr(packed_linear, "product", recorded)
    torch.manual_seed(0)
    x = torch.randn(4, 48)
    layers = {out: nn.Linear(48, out) for out in (80, 81, 64)}  # kept and runnable; kept, not runnable here; not kept
    with torch.inference_mode():
        for linear in layers.values():
            torch.testing.assert_close(PackedLinear(linear)(x), linear(x), rtol=1e-5, atol=1e-5)
        assert ran == ["transposed", default_kernel(4, 81, threads), default_kernel(4, 64, threads)]
        assert packed_linear.CHOICES.chosen == {(4, 48, 80, True, threads): "transposed"}
        # each shape's entry is looked up once: later steps do not read the file (nor the CPU's name) again
        monkeypatch.setattr(packed_linear.CHOICES.kept, "get", lambda key: pytest.fail(f"read {key} again"))
        for linear in layers.values():
            PackedLinear(linear)(x)


@needs_onednn
def test_a_weight_changed_in_place_is_repacked():
    torch.manual_seed(0)
    linear = nn.Linear(16, 24)
    packed = PackedLinear(linear)
    x = torch.randn(3, 16)
    with torch.no_grad():
        packed(x)  # packs the weight as it is now
        linear.weight.mul_(2)  # an optimizer step or a loaded state dict writes in place
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
    packed.load_state_dict({"weight": torch.zeros(24, 16), "bias": torch.ones(24)})
    with torch.no_grad():
        assert torch.equal(packed(x), torch.ones(3, 24))


@needs_onednn
def test_layers_wrapping_one_weight_share_one_copy_of_each_form():
    # Each traced step wraps the model's layers anew: a packed copy per wrapper held the weights once per trace.
    linear = nn.Linear(16, 24)
    for form in ("onednn", "transposed", ("blocked_t", 2)):
        made = weight_form(linear.weight, form)
        assert weight_form(PackedLinear(linear).weight, form) is made
        assert weight_form(copy.deepcopy(linear).weight, form) is not made
        with torch.no_grad():
            linear.weight.add_(1)
        assert weight_form(linear.weight, form) is not made


def test_gradients_flow_through_the_plain_product():
    torch.manual_seed(0)
    linear = nn.Linear(16, 24)
    packed = PackedLinear(copy.deepcopy(linear))
    x = torch.randn(3, 16)
    linear(x).square().sum().backward()
    packed(x).square().sum().backward()
    torch.testing.assert_close(packed.weight.grad, linear.weight.grad)


@needs_onednn
def test_a_packed_model_decodes_the_same_tokens_and_keeps_its_weights():
    torch.manual_seed(0)
    model = GPT(small_config()).eval()
    packed = copy.deepcopy(model)
    note = pack_for_inference(packed)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert note == f"{len(linears)} {PACKED}"
    assert not any(isinstance(m, nn.Linear) for m in packed.modules())
    assert packed.lm_head.weight is packed.transformer.wte.weight  # still tied
    assert packed.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(packed.state_dict().values(), model.state_dict().values()))
    prompts = torch.randint(0, 50257, (3, 7))
    for params in (SamplingParams(max_new_tokens=12, temperature=0, stop_at_eot=False),
                   SamplingParams(max_new_tokens=12, temperature=0.9, top_k=40, seed=5, stop_at_eot=False)):
        assert torch.equal(generate(packed, prompts, params, decode="dynamic"),
                           generate(model, prompts, params, decode="dynamic"))
    assert pack_for_inference(packed) == "no float32 linear layers to pack"  # packing twice changes nothing


@needs_onednn
def test_an_int8_model_keeps_its_int8_layers_and_packs_only_a_float_head():
    model = GPT(small_config()).eval()
    quantize_model(model, head="fp32")
    assert pack_for_inference(model) == f"1 {PACKED}"
    assert isinstance(model.lm_head, PackedLinear) and isinstance(model.transformer.h[0].mlp.c_fc, Int8Linear)


def test_without_onednn_the_model_is_left_as_it_is_and_the_note_says_why(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    model = GPT(small_config())
    assert pack_for_inference(model) == ("linear layers run as nn.Linear: this PyTorch build has no oneDNN to pack "
                                         "them for")
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
