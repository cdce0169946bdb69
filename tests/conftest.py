"""Shared fixtures: small models built in milliseconds, saved as real artifacts when needed."""
from __future__ import annotations

import os
import signal

import pytest
import torch
from hypothesis import HealthCheck, settings

# Two cores, several processes in some tests (and one pytest-xdist worker per core): keep each process to a
# fair share, the processes the tests start too (a test that times thread counts sets its own).  A child left at
# torch's default of a thread per core spins its OpenMP threads waiting for a core the other worker holds: the bench
# fixture took 131 s of CPU so beside a busy core, 88 s with one thread a process.
FAIR_SHARE = max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))))
torch.set_num_threads(FAIR_SHARE)
os.environ.setdefault("OMP_NUM_THREADS", str(FAIR_SHARE))

# What traces cost and saved is kept between processes in a file (decode/kept_ratios.py); in the suite each test's
# decisions come from its own process alone, as no test may depend on another having run (the tests of the file
# name one of their own).  Set before decode/trace_payback.py makes its table; subprocesses inherit it.
os.environ["GPT2_TRACE_TIMINGS"] = "off"
# The kernel chosen per product shape is kept so too (model/kernel_choice.py): each test's choices are its own.
os.environ["GPT2_KERNEL_CHOICES"] = "off"

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


# Process-wide state that a test (or a tool's `main` run in-process) may change and that would reach the tests after it
# on the same pytest-xdist worker: `process_state_restored` puts it back after every test.  (Huge pages cannot be put
# back: tests/test_huge_pages.py runs its passes in processes of their own.)
GUARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGPIPE,
                   signal.SIGALRM, signal.SIGCHLD)


def process_state() -> dict:
    return {"torch threads": torch.get_num_threads(), "grad mode": torch.is_grad_enabled(),
            "default dtype": torch.get_default_dtype(), "working folder": os.getcwd(),
            "environment": {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},  # pytest's own
            **{f"{signal.Signals(s).name} handler": signal.getsignal(s)
                                                for s in GUARDED_SIGNALS}}


def restore_process_state(before: dict) -> list[str]:
    """Put back whatever differs from `before`; the names of what did."""
    after = process_state()
    changed = [name for name in before if after[name] != before[name]]
    said = [name if name != "environment" else "environment: " + ", ".join(sorted(
        key for key in before[name].keys() | after[name].keys() if before[name].get(key) != after[name].get(key)))
        for name in changed]
    for name in changed:
        value = before[name]
        if name == "torch threads":
            torch.set_num_threads(value)
        elif name == "grad mode":
            torch.set_grad_enabled(value)
        elif name == "default dtype":
            torch.set_default_dtype(value)
        elif name == "working folder":
            os.chdir(value)
        elif name == "environment":
            for key in set(os.environ) - set(value) - {"PYTEST_CURRENT_TEST"}:
                del os.environ[key]
            os.environ.update(value)
        elif value is not None:  # None: a handler installed outside Python, which cannot be put back from it
            signal.signal(signal.Signals[name.removesuffix(" handler")], value)
    return said


@pytest.fixture(autouse=True)
def process_state_restored(request):
    """Every test starts from the process-wide state the one before it started from, in any order: thread counts,
    grad mode, default dtype, working folder, environment and signal handlers are put back after each test (after
    its own fixtures' teardown, as this fixture is set up first).  What was put back is listed at the end of the
    run (`pytest_terminal_summary`), so a test that leaves state behind is seen, not only tolerated."""
    before = process_state()
    yield
    if changed := restore_process_state(before):
        request.node.user_properties.append(("process state restored", ", ".join(changed)))


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
LONGEST_FIRST = ("test_bench.py", "test_hostile_signals.py", "test_config_chain.py", "test_parallel.py",
                 "test_launch.py", "test_train.py", "test_hostile_stops.py", "test_demo.py", "test_serve_live.py",
                 "test_resume.py", "test_launch_failures.py", "test_folder.py", "test_speculative_bench.py",
                 "test_serve_api.py", "test_speculative.py", "test_playground.py", "test_hostile_cli.py",
                 "test_data.py", "test_docs_gate.py", "test_configs.py", "test_hostile_artifacts.py")


def pytest_collection_modifyitems(config, items):
    if shuffled(config):  # `make test-random`: pytest-randomly's order, files and tests, is the order run
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order within a file is kept


def shuffled(config) -> bool:
    """Whether pytest-randomly orders this run (pyproject.toml's addopts turn it off; `make test-random` on)."""
    return config.pluginmanager.hasplugin("randomly") and config.getoption("randomly_reorganize", False)


def pytest_terminal_summary(terminalreporter):
    """The reason the browser tests skipped, in one line: `-q` summaries count skips without saying why."""
    reasons = {report.longrepr[2].removeprefix("Skipped: ") for report in terminalreporter.stats.get("skipped", [])
               if isinstance(report.longrepr, tuple) and "browser tests skipped" in report.longrepr[2]}
    for reason in sorted(reasons):
        terminalreporter.write_line(reason)
    restored = sorted({(report.nodeid, value) for reports in terminalreporter.stats.values() for report in reports
                       for name, value in getattr(report, "user_properties", ()) if name == "process state restored"})
    if restored:
        terminalreporter.write_line(f"process-wide state put back after {len(restored)} tests: " +
                                    "; ".join(f"{nodeid} ({what})" for nodeid, what in restored))
