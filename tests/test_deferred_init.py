"""Building on the meta device: the seeded values replayed one parameter at a time are exactly `GPT(config)`'s, and a
TP or FSDP rank that materialises only its shards holds exactly the slices of the single-device weights (gathered
back, they are the single-device model, bit for bit)."""
from __future__ import annotations


import pytest
import torch

from model.config import preset
from model.deferred_init import empty_model, seeded_parameters
from model.gpt import GPT
from tests.gloo_ranks import run_ranks

SEED = 1234
# Pruned-width layers (unequal heads and hidden sizes) as well as the plain shape.
CONFIGS = {
    "tiny": preset("tiny"),
    "pruned": preset("tiny", n_head_per_layer=[4, 2, 4, 2], mlp_hidden=[64, 128, 32, 512]),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_seeded_values_are_the_single_device_models_and_leave_the_generator_where_it_does(name):
    config = CONFIGS[name]
    torch.manual_seed(SEED)
    reference = GPT(config)
    next_draw = torch.rand(4)
    values = dict(seeded_parameters(config, SEED))
    assert torch.equal(torch.rand(4), next_draw)  # dropout and the rest draw on from the same state
    expected = dict(reference.named_parameters())
    assert list(values) != [] and set(values) == set(expected)
    for key, tensor in expected.items():
        assert torch.equal(values[key], tensor.detach()), key


def test_seeded_values_come_one_module_at_a_time():
    """Each value is yielded as soon as it is final: the embedding (rewritten by the tied head) comes after the
    blocks' first weights, and a residual projection only after every module was visited."""
    order = [name for name, _ in seeded_parameters(CONFIGS["tiny"], SEED)]
    assert order.index("transformer.h.0.attn.c_attn.weight") < order.index("transformer.wte.weight")
    assert order.index("transformer.wte.weight") < order.index("transformer.h.0.attn.c_proj.weight")


def test_an_empty_model_holds_no_values():
    model = empty_model(CONFIGS["tiny"])
    assert all(p.is_meta for p in model.parameters())
    assert model.lm_head.weight is model.transformer.wte.weight


def _materialise_each_layout(rank, world, root, result):
    from parallel import CommsMeter, ParallelDims, parallelize
    from parallel.distributed import init_distributed
    from parallel.materialize import builds_on_meta
    from parallel.strategies import STRATEGIES
    from training.checkpoint.gather import full_model_state
    config = CONFIGS["pruned"]
    torch.manual_seed(SEED)
    single = {k: v.detach() for k, v in GPT(config).named_parameters()}
    for mode, dims in (("tp", ParallelDims(tp=world, distributed=True)),
                       ("fsdp", ParallelDims(dp_shard=world, distributed=True))):
        ctx = init_distributed(dims, device=torch.device("cpu"), timeout_s=60)
        strategy = STRATEGIES[mode]
        assert builds_on_meta(ctx, strategy)
        par = parallelize(empty_model(config), ctx, strategy, CommsMeter(), values=seeded_parameters(config, SEED))
        model = par.model
        result[f"{mode}_tied"] = model.lm_head.weight is model.transformer.wte.weight
        result[f"{mode}_held"] = sum((p.to_local() if hasattr(p, "to_local") else p).numel()
                                     for p in model.parameters())
        gathered = full_model_state(par)
        if rank == 0:
            result[f"{mode}_unequal"] = [k for k, v in single.items() if not torch.equal(gathered[k], v)]
        idx = torch.arange(8)[None]
        loss = par.module(idx, idx)[1]
        loss.backward()
        result[f"{mode}_loss"] = float(loss)
    result["numel"] = sum(v.numel() for v in single.values())
    torch.manual_seed(SEED)
    model = GPT(config)
    result["single_loss"] = float(model(torch.arange(8)[None], torch.arange(8)[None])[1])


def test_sharded_ranks_hold_exact_slices_of_the_single_device_weights(tmp_path):
    world = 2
    results = run_ranks(_materialise_each_layout, world, tmp_path)
    for mode in ("tp", "fsdp"):
        assert results[0][f"{mode}_unequal"] == [], mode
        for r in results:
            assert r[f"{mode}_tied"], mode
            # A rank holds its shard: well under the whole model (replicated LayerNorms and biases aside).
            assert r[f"{mode}_held"] < 0.6 * r["numel"], (mode, r[f"{mode}_held"], r["numel"])
            assert r[f"{mode}_loss"] == pytest.approx(results[0]["single_loss"], rel=1e-5), mode
