"""Where experiment results go: one `NAME.json` (and plots) per experiment in the results folder."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def add_results_arg(parser) -> None:
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                        help="folder for NAME.json and the plots (default: bench/results)")


def write_result(results_dir: Path, name: str, result: dict) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(path)  # a reader never sees half a file
    print(f"wrote {path}")
    return path


def read_result(results_dir: Path, name: str) -> dict | None:
    path = results_dir / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def save_figure(fig, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=90)
    plt.close(fig)
    return path.name


def run_experiment(name: str, argv, parse_args, measure, plot) -> dict:
    """What every experiment script does: parse its flags, measure, plot, write results/NAME.json."""
    args = parse_args(argv)
    result = measure(args)
    result["plot"] = plot(result, args.results_dir / f"{name}.png")
    write_result(args.results_dir, name, result)
    return result
