"""The step's finiteness check made on the device (the fused update launched with its skip flag before the loss
and norm are read back) against the read-before-update order: the same weights after finite steps, and a
non-finite step refused with weights and optimizer state untouched either way."""
import pytest
import torch

from model.config import preset
from model.gpt import GPT
from runtime.device import precision_policy
from training.step import NonFiniteStep, TrainStep

CPU = torch.device("cpu")


def step_of(read_before_update: bool) -> TrainStep:
    torch.manual_seed(0)
    model = GPT(preset("tiny", block_size=32))
    step = TrainStep.single_device(model, CPU, precision_policy(CPU), lr=1e-2)
    if read_before_update:
        step = TrainStep(step.module, step.optimizer, step.strategy, CPU, step.precision, read_before_update=True)
    return step


def batches(seed: int):
    g = torch.Generator().manual_seed(seed)
    return lambda: (torch.randint(0, 256, (2, 32), generator=g), torch.randint(0, 256, (2, 32), generator=g))


def test_the_device_check_is_taken_where_the_fused_optimizer_allows_it():
    assert step_of(read_before_update=False).checks_on_device
    assert not step_of(read_before_update=True).checks_on_device


def test_both_orders_give_the_same_weights_and_results():
    on_device, read_first = step_of(False), step_of(True)
    for seed in range(3):
        assert on_device(batches(seed)) == read_first(batches(seed))
    for a, b in zip(on_device.module.parameters(), read_first.module.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("read_before_update", [False, True])
def test_a_non_finite_step_leaves_weights_and_optimizer_state_untouched(read_before_update, monkeypatch):
    step = step_of(read_before_update)
    step(batches(0))
    weights = [p.detach().clone() for p in step.module.parameters()]
    state = [{k: v.clone() for k, v in s.items()} for s in step.optimizer.state.values()]
    forward = step.module.forward
    monkeypatch.setattr(step.module, "forward", lambda x, y: (None, forward(x, y)[1] * float("nan")))
    with pytest.raises(NonFiniteStep, match=r"loss became nan .* at step 2, before its update \(not applied\)"):
        step(batches(1))
    assert all(torch.equal(a, b) for a, b in zip(weights, step.module.parameters()))
    after = list(step.optimizer.state.values())
    assert len(after) == len(state)
    assert all(torch.equal(before[k], now[k]) for before, now in zip(state, after) for k in before)
    assert all(p.grad is None for p in step.module.parameters())
