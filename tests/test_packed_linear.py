"""model/packed_linear.py: the oneDNN-packed linear computes nn.Linear's product, follows weights changed in
place, keeps gradients on the plain product, and a packed model decodes the unpacked model's tokens."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from decode.generate import generate
from model.gpt import GPT
from model.int8 import Int8Linear, quantize_model
from model.packed_linear import PACKED, PackedLinear, pack_for_inference
from decode.sampling import SamplingParams
from tests.conftest import small_config

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this PyTorch has no oneDNN")


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 48), (12, 48), (2, 5, 48)])
def test_packed_product_equals_nn_linear(bias, shape):
    torch.manual_seed(0)
    linear = nn.Linear(48, 80, bias=bias)
    packed = PackedLinear(linear)
    x = torch.randn(shape)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
def test_one_row_runs_as_one_block_of_weight_rows_per_thread(bias, monkeypatch):
    """A decoding step at batch 1: a batched product over blocks of the weight's rows (no copy), the same values as
    nn.Linear; a width the threads do not divide, and more rows, keep oneDNN's product."""
    torch.manual_seed(0)
    blocks = []
    one_row = PackedLinear._one_row
    monkeypatch.setattr(PackedLinear, "_one_row", lambda self, x, parts: (blocks.append(parts),
                                                                          one_row(self, x, parts))[1])
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for out_features, rows, expected in ((80, (1, 1), [2]), (81, (1, 1), []), (80, (3,), [])):
            blocks.clear()
            linear = nn.Linear(48, out_features, bias=bias)
            x = torch.randn(*rows, 48)
            with torch.inference_mode():
                torch.testing.assert_close(PackedLinear(linear)(x), linear(x), rtol=1e-5, atol=1e-5)
            assert blocks == expected
    finally:
        torch.set_num_threads(threads)


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
def test_layers_wrapping_one_weight_share_one_packed_copy():
    # Each traced step wraps the model's layers anew: a packed copy per wrapper held the weights once per trace.
    linear = nn.Linear(16, 24)
    first, second = PackedLinear(linear), PackedLinear(linear)
    packed = first.packed_weight()
    assert second.packed_weight() is packed
    assert PackedLinear(copy.deepcopy(linear)).packed_weight() is not packed
    with torch.no_grad():
        linear.weight.add_(1)
    assert second.packed_weight() is not packed and second.packed_weight() is first.packed_weight()


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
