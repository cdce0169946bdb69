"""training/optim.py: the warmup-then-cosine schedule and the peak learning rate for a larger global batch."""
from __future__ import annotations

import pytest

from training.optim import lr_at, scaled_lr


def test_learning_rate_scales_with_global_batch():
    assert scaled_lr(1e-3, 32, 8, "linear") == pytest.approx(4e-3)
    assert scaled_lr(1e-3, 32, 8, "sqrt") == pytest.approx(2e-3)
    assert scaled_lr(1e-3, 32, 8, "none") == 1e-3


def test_schedule_warms_up_linearly_then_decays_to_its_floor():
    assert lr_at(0, 1.0, warmup_steps=10, max_steps=100) == pytest.approx(0.1)
    assert lr_at(9, 1.0, warmup_steps=10, max_steps=100) == pytest.approx(1.0)
    assert lr_at(100, 1.0, warmup_steps=10, max_steps=100) == pytest.approx(0.1)
    middle = lr_at(55, 1.0, warmup_steps=10, max_steps=100)
    assert 0.1 < middle < 1.0
