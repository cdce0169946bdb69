"""Fault drills: what a reader, a kill -9, a poisoned request, slow clients and a dead rank cost.

    python -m bench.experiments faults            # quick: 2 minutes on 2 CPU cores, loopback only
    python -m bench.experiments faults --kills 10 --rank-kills 3 --slow-clients 100   # more trials

Each drill is one module of bench/drills/: it runs the real tools in their own processes and counts trials,
failures and work lost.  In the order they run (each from its module's docstring):
"""
from __future__ import annotations

import shutil
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from bench.drills import DRILLS
from bench.drills.drill import Drill, DrillSettings
from bench.experiment import Experiment
from bench.plots import finish, plt
from bench.report_page import Page
from runtime.timing import Environment, environment


@dataclass
class Faults:
    drills: list[Drill]
    environment: Environment


def about(drill: ModuleType) -> str:
    """A drill's docstring as an item of this experiment's list."""
    return "- " + textwrap.indent(drill.__doc__.strip(), "  ")[2:] + "\n"


def measure(settings: DrillSettings, work_dir: Path) -> Faults:
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    drills = []
    for drill in DRILLS:
        started = time.perf_counter()
        result = drill.run(settings, work_dir)
        if result is None:  # not asked for in these settings
            continue
        result.seconds = time.perf_counter() - started
        print(f"{result.name:40} {result.trials:6} trials {result.failures:4} failures   work lost "
              f"{result.work_lost:>12}   {result.seconds:6.1f} s")
        drills.append(result)
    return Faults(drills, environment(torch.device("cpu")))


def plot(result: Faults):
    names = [d.name for d in result.drills]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(names) + 1.2))
    ax.barh(names, [d.trials for d in result.drills], color="tab:green", label="trials")
    ax.barh(names, [d.failures for d in result.drills], color="tab:red", label="failures")
    ax.set_xscale("symlog")
    ax.invert_yaxis()
    return finish(fig, (ax,), "fault drills", grid="x", legend=True)


def section(res: Faults, page: Page) -> None:
    page.table(["drill", "trials", "failures", "work lost", "seconds"],
               [[d.name, str(d.trials), str(d.failures), d.work_lost, f"{d.seconds:.0f}"] for d in res.drills])
    notes = [f"- {d.name}: {note}" for d in res.drills for note in d.notes]
    if notes:
        page.add("\n".join(notes) + "\n")


EXPERIMENT = Experiment(
    name="faults", title="Fault drills", about=__doc__ + "".join(about(drill) for drill in DRILLS),
    settings=DrillSettings, quick=DrillSettings(),
    full=DrillSettings(reader_steps=40, readers=3, kills=10, kill_steps=20, poison_batches=10, slow_clients=100,
                       rank_kills=3, grace_modes=["tp", "fsdp"]),
    result=Faults, measure=measure, plot=plot, section=section)
