"""runtime/cli.py's bounded options: one message form for an out-of-range flag in every tool."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import pytest

from bench.experiments.prune_speed import Settings as PruneSpeedSettings
from bench.leaderboard import LeaderboardConfig
from prune.config import PruneConfig
from prune.errors import PruneError
from quantize.dynamic import QuantizeConfig, QuantizeError
from runtime.cli import add_dataclass_args, check_options, option
from runtime.errors import UserError
from serve.config import ServeConfig, ServeConfigError
from training.config import TrainConfig, TrainingError


class DemoError(UserError):
    pass


@dataclass
class Demo:
    batch_size: int = option(8, "rows", min=1)
    lr: float = option(1e-3, "step size", above=0)
    dropout: float = option(0.0, "probability", min=0, below=1)
    port: int = option(8000, "TCP port", min=0, max=65535)
    context: int | None = option(None, "window (default: the model's)", min=2)
    sizes: list[int] = option([1, 2], "batch sizes", min=1)

    def __post_init__(self):
        check_options(self, DemoError)


@pytest.mark.parametrize("settings, message", [
    (dict(batch_size=0), "--batch-size must be at least 1, got 0"),
    (dict(lr=0.0), "--lr must be above 0, got 0.0"),
    (dict(lr=float("nan")), "--lr must be above 0, got nan"),
    (dict(dropout=1.0), "--dropout must be below 1, got 1.0"),
    (dict(port=65536), "--port must be at most 65535, got 65536"),
    (dict(context=1), "--context must be at least 2, got 1"),
    (dict(sizes=[4, 0]), "--sizes must be at least 1, got 0"),
])
def test_a_value_outside_its_bounds_names_the_flag_the_bound_and_the_value(settings, message):
    with pytest.raises(DemoError) as error:
        Demo(**settings)
    assert str(error.value) == message


def test_values_at_the_bounds_and_none_for_not_given_are_accepted():
    Demo(batch_size=1, lr=1e-12, dropout=0.0, port=65535, context=2, sizes=[1])
    Demo(port=0, context=None)


def test_the_help_shows_the_bounds():
    parser = argparse.ArgumentParser()
    add_dataclass_args(parser, Demo)
    text = " ".join(parser.format_help().split())
    assert "rows (at least 1; default: 8)" in text
    assert "probability (at least 0 and below 1; default: 0.0)" in text
    assert "window (default: the model's) (at least 2)" in text


@pytest.mark.parametrize("make, error, message", [
    (lambda: TrainConfig(batch_size=0), TrainingError, "--batch-size must be at least 1, got 0"),
    (lambda: TrainConfig(lr=float("inf")), TrainingError, "--lr must be a finite number, got inf"),
    (lambda: ServeConfig(max_batch_size=0), ServeConfigError, "--max-batch-size must be at least 1, got 0"),
    (lambda: ServeConfig(threads=0), ServeConfigError, "--threads must be at least 1, got 0"),
    (lambda: QuantizeConfig(threads=-1), QuantizeError, "--threads must be at least 1, got -1"),
    (lambda: PruneConfig(target=1.0), PruneError, "--target must be below 1, got 1.0"),
])
def test_the_tools_refuse_an_out_of_range_flag_in_the_one_form(make, error, message):
    with pytest.raises(error) as raised:
        make()
    assert str(raised.value) == message


def test_the_tools_accept_a_value_at_the_bound():
    TrainConfig(batch_size=1, warmup_steps=0, dropout=0.0, min_lr_ratio=1.0)
    ServeConfig(max_batch_size=1, max_queue=0, threads=1, port=0)
    QuantizeConfig(threads=1, repeats=1)
    PruneConfig(target=0.5, threads=1, finetune_steps=0)


@pytest.mark.parametrize("cls", [ServeConfig, QuantizeConfig, PruneConfig, LeaderboardConfig, PruneSpeedSettings])
def test_threads_means_the_same_in_every_tool(cls):
    """Not given (None): torch's own choice; given: at least 1."""
    [field] = [f for f in dataclasses.fields(cls) if f.name == "threads"]
    assert field.default is None and field.metadata["bounds"] == {"min": 1}
    assert "default: torch's choice" in field.metadata["help"]
