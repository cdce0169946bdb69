"""prune's and quantize's settings at their edges, written here from what each flag means (not read from the
configs): each bound takes its edge and refuses the first value past it, each default is the one the help promises,
and prune's checks against the model take the model's whole context and not a token more."""
from __future__ import annotations

import math

import pytest

from model.gpt import GPT
from prune.config import PruneConfig, PruneError, method_names, validate_against_model
from prune.methods import METHODS
from prune.speed import GENERATION_PROMPT_TOKENS
from quantize.dynamic import QuantizeConfig, QuantizeError
from tests.conftest import small_config

# (flag's field, its default, values at its edges (taken), values just past them (refused))
PRUNE = [
    ("target", None, [1e-9, 0.5, 0.999999], [0, 0.0, 1, 1.0, -0.1, math.nan]),
    ("rounds", 4, [1], [0, -1]),
    ("finetune_steps", 40, [0, 1], [-1]),
    ("lr", 3e-4, [1e-12], [0, 0.0, -1e-4, math.nan]),
    ("weight_decay", 0.1, [0.0], []),
    ("warmup_steps", 5, [0], [-1]),
    ("batch_size", 8, [1], [0]),
    ("block_size", None, [1], [0]),
    ("eval_batches", 10, [1], [0]),
    ("calibration_batches", 4, [1], [0]),
    ("threads", None, [1], [0]),
    ("seed", 1234, [0], []),
    ("speed_batch", 4, [1], [0]),
    ("speed_seq_len", 128, [1], [0]),
    ("speed_repeats", 5, [1], [0]),
    ("generation_tokens", 16, [1], [0]),
    ("sparse_format_check", True, [False], []),
    ("dense_control", False, [True], []),
    ("method", "magnitude", ["row", "wanda", "magnitude,row", " row , wanda "], ["", ",", "banana", "row,banana"]),
    ("prune_params", "linear", ["linear,bias"], []),
]
QUANTIZE = [
    ("head", "int8", ["fp16", "fp32"], []),
    ("threads", None, [1], [0, -1]),
    ("eval_batches", 16, [1], [0]),
    ("eval_batch_size", 4, [1], [0]),
    ("eval_block_size", None, [1], [0]),
    ("prompt_tokens", 32, [1], [0]),
    ("new_tokens", 32, [1], [0]),
    ("repeats", 5, [1], [0]),
    ("overwrite", False, [True], []),
]
REQUIRED = {PruneConfig: {"target": 0.5}, QuantizeConfig: {}}
ERRORS = {PruneConfig: PruneError, QuantizeConfig: QuantizeError}


@pytest.mark.parametrize("config, table", [(PruneConfig, PRUNE), (QuantizeConfig, QUANTIZE)], ids=["prune", "quantize"])
def test_each_setting_has_its_default_takes_its_edges_and_refuses_past_them(config, table):
    base = REQUIRED[config]
    made = config(**base)
    wrong = [(name, "default", getattr(made, name)) for name, default, _, _ in table
             if name not in base and getattr(made, name) != default]
    for name, _, good, bad in table:
        for value in good:
            try:
                config(**{**base, name: value})
            except ERRORS[config] as e:
                wrong.append((name, value, f"refused: {e}"))
        for value in bad:
            try:
                config(**{**base, name: value})
            except ERRORS[config]:
                continue
            wrong.append((name, value, "accepted"))
    assert not wrong, wrong


def test_a_missing_target_and_a_bad_method_are_named():
    with pytest.raises(PruneError, match=r"^--target is required: the final sparsity, e.g. --target 0.8$"):
        PruneConfig()
    with pytest.raises(PruneError, match=r"^--method 'banana': choose from magnitude, row, wanda \(several: "
                                         r"comma-separated\)$"):
        PruneConfig(target=0.5, method="banana")
    assert method_names(PruneConfig(target=0.5, method=" row , wanda ,")) == ["row", "wanda"]
    with pytest.raises(PruneError, match="--target must be below 1, got 1.5"):
        PruneConfig(target=1.5)
    with pytest.raises(PruneError, match="linear weights only"):
        PruneConfig(target=0.5, method="wanda", prune_params="linear,embedding")


@pytest.mark.parametrize("context", [64, 256])
def test_prune_takes_the_model_s_whole_context_and_not_a_token_more(context):
    model = GPT(small_config(block_size=context))
    method = METHODS["magnitude"]("linear")
    fits = dict(target=0.5, speed_seq_len=context, generation_tokens=context - GENERATION_PROMPT_TOKENS)
    assert validate_against_model(PruneConfig(**fits), model, method) == min(128, context)  # the default block
    assert validate_against_model(PruneConfig(**fits, block_size=context), model, method) == context
    too_long = {"block_size": context + 1, "speed_seq_len": context + 1,
                "generation_tokens": context - GENERATION_PROMPT_TOKENS + 1}
    messages = {"block_size": f"--block-size {context + 1} exceeds the model's context of {context}",
                "speed_seq_len": f"--speed-seq-len {context + 1} exceeds the model's context of {context}",
                "generation_tokens": f"--generation-tokens {context - GENERATION_PROMPT_TOKENS + 1} plus the "
                                     f"{GENERATION_PROMPT_TOKENS}-token prompt exceeds the model's context of {context}"}
    for name, value in too_long.items():
        with pytest.raises(PruneError) as refused:
            validate_against_model(PruneConfig(**{**fits, name: value}), model, method)
        assert str(refused.value) == messages[name]
