"""Shared fixtures: small models built in milliseconds, saved as real artifacts when needed."""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# Two cores, several processes in some tests (and one pytest-xdist worker per core): keep each process to a
# fair share.
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1)))))

# Hostile-input properties (tests/hostile.py): `ci` is fixed-seed and bounded for `make test`; `fuzz` is `make
# fuzz`'s long random run.  No example database: a clean clone and CI must draw the same examples.
_QUIET = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]
settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True,
                          suppress_health_check=_QUIET)
settings.register_profile("fuzz", deadline=None, database=None, print_blob=True, suppress_health_check=_QUIET)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

from model.config import GPTConfig  # noqa: E402
from model.gpt import GPT  # noqa: E402
from runtime.provenance import provenance  # noqa: E402
from storage.artifact import save_artifact  # noqa: E402


def small_config(**overrides) -> GPTConfig:
    return GPTConfig(**{**dict(n_layer=2, n_head=4, n_embd=32, block_size=64), **overrides})


@pytest.fixture
def small_model() -> GPT:
    torch.manual_seed(0)
    return GPT(small_config()).eval()


def save_small_artifact(folder, **config_overrides) -> str:
    """A seeded small model saved as a float artifact; returns the folder."""
    torch.manual_seed(0)
    model = GPT(small_config(**config_overrides))
    save_artifact(folder, model, model.config, "float", provenance("tests"))
    return str(folder)


@pytest.fixture
def small_artifact(tmp_path) -> str:
    return save_small_artifact(tmp_path / "artifact")


def interrupt_training_at_batch(monkeypatch, n: int):
    """Make the n-th training batch raise KeyboardInterrupt (as Ctrl-C would); returns a function that undoes it."""
    from data.loader import WindowSampler
    real_next, calls = WindowSampler.next_batch, {"n": 0}

    def next_batch(self):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return real_next(self)

    monkeypatch.setattr(WindowSampler, "next_batch", next_batch)
    return lambda: monkeypatch.setattr(WindowSampler, "next_batch", real_next)


# pytest-xdist's workers take whole files (--dist loadfile) in collection order (`make test` passes
# --no-loadscope-reorder: by default xdist puts the files with the most tests first), so the longest files go
# first: started last, a one-minute file would leave the other core idle at the end.  Measured with
# `pytest --durations=0` on 2 cores; the order only changes when files run, never what they check.
LONGEST_FIRST = ("test_bench.py", "test_parallel.py", "test_launch.py", "test_train.py", "test_folder.py",
                 "test_serve_live.py", "test_resume.py", "test_speculative.py", "test_speculative_bench.py",
                 "test_hostile_signals.py", "test_hostile_artifacts.py", "test_hostile_names.py", "test_data.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order within a file is kept


def pytest_terminal_summary(terminalreporter):
    """The reason the browser tests skipped, in one line: `-q` summaries count skips without saying why."""
    reasons = {report.longrepr[2].removeprefix("Skipped: ") for report in terminalreporter.stats.get("skipped", [])
               if isinstance(report.longrepr, tuple) and "browser tests skipped" in report.longrepr[2]}
    for reason in sorted(reasons):
        terminalreporter.write_line(reason)
