"""What a benchmark experiment is.  Each module in bench/experiments/ defines one `Experiment`: its name,
its settings (an `ExperimentSettings` dataclass, or one of the kinds below that hold the options several share:
help and bounds in each field's `option`) with a quick and a full instance (and a GPU one for the experiments
`make bench` runs on a CUDA machine), a measurement returning a typed result, a plot of that result (drawn with
bench/plots.py) and its section of the report.
The registry (bench/experiments/__init__.py) lists them; `python -m bench.experiments`, bench/run_all.py
and bench/report.py loop over it, and nothing else lists them.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, Protocol, TypeVar

from bench.plots import save_figure
from bench.record import RESULTS_DIR, read_result, write_result
from bench.report_page import Page
from model.config import PRESETS
from runtime.cli import check_options, non_default_flags, option
from runtime.errors import UserError
from runtime.timing import Environment

WORK_ROOT = Path("out/bench")


class SettingsError(UserError):
    """Settings an experiment cannot run with."""


class ExperimentError(UserError):
    """An experiment that cannot run as asked: a tool it starts failed, or an input is missing."""


@dataclass
class ExperimentSettings:
    """The base of every experiment's settings: each field is a `runtime.cli.option`, whose bounds are checked
    when the settings are made; a subclass with checks of its own calls `super().__post_init__()` first."""

    def __post_init__(self):
        check_options(self, SettingsError)


@dataclass
class TrainingSettings(ExperimentSettings):
    """What the experiments that time training share: the model, its text and the device."""
    model: str = option("tiny", "model preset", choices=tuple(PRESETS))
    dataset: str = option("builtin", "training text (and validation text where it evaluates)")
    device: str = option("auto", "auto, cpu, cuda, ...")


@dataclass
class RandomWeightsSettings(ExperimentSettings):
    """What the experiments that time a model with random weights (speed does not depend on training) share."""
    model: str = option("gpt2", "model preset (random weights)", choices=tuple(PRESETS))


class Result(Protocol):
    environment: Environment  # the report's machine line and load check read it from every result


S = TypeVar("S")
R = TypeVar("R", bound=Result)


@dataclass(frozen=True)
class Workspace:
    results_dir: Path = RESULTS_DIR  # NAME.json and NAME.png
    work_dir: Path | None = None  # scratch for the runs an experiment starts (default: out/bench/NAME)


@dataclass(frozen=True)
class Experiment(Generic[S, R]):
    name: str  # results/NAME.json, results/NAME.png, bench/experiments/NAME.py
    title: str  # the report's heading
    about: str  # the module's docstring: what is measured, and how
    settings: type[S]
    quick: S  # `make bench`: the whole benchmark in under 20 minutes on 2 CPU cores
    full: S
    result: type[R]
    measure: Callable[[S, Path], R]  # (settings, scratch folder) -> result
    plot: Callable[[R], object]  # result -> a matplotlib figure
    section: Callable[[R, Page], None]  # the report's text and tables for the result (the plot follows them)
    # `make bench` on a CUDA machine: the GPU-sized settings of the experiments that compare us with a peer
    # there (into results/gpu/, the report's GPU section); None: not part of the GPU run.
    gpu: S | None = None

    @property
    def source(self) -> str:
        return f"bench/experiments/{self.name}.py"

    def work_dir(self, workspace: Workspace) -> Path:
        return workspace.work_dir or WORK_ROOT / self.name

    def figure(self, results_dir: Path) -> Path:
        return results_dir / f"{self.name}.png"

    def run(self, settings: S, workspace: Workspace = Workspace()) -> R:
        """Measure, then write the result and its plot into the results folder."""
        result = self.measure(settings, self.work_dir(workspace))
        write_result(workspace.results_dir, self.name, result)
        save_figure(self.plot(result), self.figure(workspace.results_dir))
        return result

    def read(self, results_dir: Path) -> R | None:
        return read_result(results_dir, self.name, self.result)

    def command(self, settings: S, workspace: Workspace) -> list[str]:
        """The command line that runs this experiment with `settings` (flags for what differs from the
        settings' defaults) in its own process."""
        return [sys.executable, "-m", "bench.experiments", self.name, *non_default_flags(settings),
                "--results-dir", str(workspace.results_dir), "--work-dir", str(self.work_dir(workspace))]

