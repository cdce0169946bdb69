"""Run one experiment: measure, then write bench/results/NAME.json and NAME.png.

    python -m bench.experiments --help                    # the experiments
    python -m bench.experiments batch_sweep --help        # one experiment's settings
    python -m bench.experiments batch_sweep --max-batch 64 --results-dir /tmp/results

`make bench` (bench/run_all.py) runs every experiment this way, each in its own process.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.experiment import Workspace
from bench.experiments import EXPERIMENTS, find
from bench.record import RESULTS_DIR
from runtime.cli import add_dataclass_args, dataclass_from_args, entry_point


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m bench.experiments", description=__doc__.split("\n\n")[0],
                                  formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    commands = top.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for experiment in EXPERIMENTS:
        sub = commands.add_parser(experiment.name, help=experiment.title, description=experiment.about,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        add_dataclass_args(sub, experiment.settings)
        sub.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                         help=f"folder for {experiment.name}.json and its plot (default: bench/results)")
        sub.add_argument("--work-dir", type=Path,
                         help=f"scratch folder for the runs it starts (default: out/bench/{experiment.name})")
    return top


@entry_point
def main(argv=None):
    args = parser().parse_args(argv)
    experiment = find(args.experiment)
    settings = dataclass_from_args(experiment.settings, args)
    return experiment.run(settings, Workspace(args.results_dir, args.work_dir))


if __name__ == "__main__":
    main()
