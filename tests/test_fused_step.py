"""bench/fused_decode_step.py, the fused-step trial: what it cannot run is refused in one line, and its Inductor cache is
the project's folder unless the user named another.  Its logits against the traced step's are checked by every run of
`python -m bench.experiments fused_step` (max_abs_diff and identical_tokens in its result): a test of them compiled
a step, about 30 s of CPU in every `make test`, for a trial no decode mode runs."""
from __future__ import annotations

import copy
import os

import pytest
import torch

from bench.fused_decode_step import CACHE_ENV, DEFAULT_CACHE, FusedSteps, inductor_cache
from model.int8 import quantize_model
from model.kv_cache import KVCache


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
