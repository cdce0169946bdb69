"""decode/fused_step.py: the traced step compiled by Inductor (freezing, cpp_wrapper) gives the traced step's logits
and tokens on a small model, writes the cache as the traced step does, and one compile serves every cache length."""
from __future__ import annotations

import copy
import os

import pytest
import torch

from decode.fused_step import CACHE_ENV, DEFAULT_CACHE, FixedProduct, FusedSteps, inductor_cache
from decode.trace import TracedSteps
from model.int8 import quantize_model
from model.kv_cache import KVCache
from model.packed_linear import pack_for_inference
from tests.conftest import small_config
from model.gpt import GPT


def prefilled(model: GPT, rows: int, prompt: torch.Tensor, max_len: int = 24) -> KVCache:
    cache = KVCache.allocate(model.config, rows, max_len, "cpu")
    model(prompt, cache=cache, last_only=True)
    return cache


@torch.inference_mode()  # as generate() and the server run their steps
def test_the_fused_step_gives_the_traced_step_s_logits_over_every_length(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "inductor"))  # an empty cache of the test's own
    torch.manual_seed(0)
    model = GPT(small_config(n_layer=1)).eval()
    pack_for_inference(model)
    prompt = torch.randint(0, 50257, (2, 5), generator=torch.Generator().manual_seed(1))
    caches = [prefilled(model, 2, prompt) for _ in range(2)]
    # Two rows: each product's default kernel is oneDNN's over its packed weight, which Inductor compiles only with
    # the weights frozen into constants (decode/fused_step.py's COMPILE_OPTIONS set as Dynamo captures the graph).
    traced, fused = TracedSteps(model), FusedSteps(model)
    token = torch.zeros(2, 1, dtype=torch.long)
    tokens = {"traced": [], "fused": []}
    for _ in range(6):  # lengths 6 to 11 after the compile at 6: no compile again
        expected, got = traced.step(caches[0], token), fused.step(caches[1], token)
        assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()
        token = expected[:, -1].argmax(-1, keepdim=True)
        for name, logits in (("traced", expected), ("fused", got)):
            tokens[name].append(logits[:, -1].argmax(-1))
    assert torch.equal(torch.stack(tokens["fused"]), torch.stack(tokens["traced"]))
    for k_traced, k_fused in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        assert torch.allclose(k_fused, k_traced, atol=1e-6, rtol=0)
    assert caches[1].length == 11 and list(fused.compiled) == [2]
    fixed = [m for m in fused.compiled[2]._orig_mod.model.modules() if isinstance(m, FixedProduct)]
    assert len(fixed) == 5  # the block's four products and the head, each fixed in the compiled copy
    assert all(type(m) is not FixedProduct for m in model.modules())  # the model itself is left as it was


def test_the_fused_step_refuses_what_it_cannot_run(small_model):
    int8 = copy.deepcopy(small_model)
    quantize_model(int8, head="int8")
    for model in (int8, copy.deepcopy(small_model).to(torch.float64)):
        with pytest.raises(ValueError, match="float32 model on the CPU"):
            FusedSteps(model)
    steps = FusedSteps(small_model)
    cache = KVCache.allocate(small_model.config, 1, 8, "cpu")
    with pytest.raises(ValueError, match="one token per row"):
        steps.step(cache, torch.zeros(1, 2, dtype=torch.long))


def test_inductor_s_cache_is_the_project_s_unless_the_user_named_another(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    # unset, or Inductor's own default (which importing torch._dynamo writes into the variable): the project's folder
    for value in (None, default_cache_dir()):
        if value is None:
            monkeypatch.delenv(CACHE_ENV, raising=False)
        else:
            monkeypatch.setenv(CACHE_ENV, value)
        assert inductor_cache() == DEFAULT_CACHE and os.environ[CACHE_ENV] == str(DEFAULT_CACHE)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert inductor_cache() == tmp_path / "mine"
