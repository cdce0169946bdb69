"""Where results go: one `NAME.json` (and `NAME.png`) per experiment, scorecard and run in bench/results."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from bench.typed_json import from_json, to_json
from storage.folder import write_durably

RESULTS_DIR = Path(__file__).resolve().parent / "results"
T = TypeVar("T")


def gpu_results(results_dir: Path) -> Path:
    """Where the GPU run of `make bench` puts its results, beside the CPU run's: the report has a section each."""
    return results_dir / "gpu"


def write_result(results_dir: Path, name: str, result: Any) -> Path:
    """`result` (a dataclass or plain JSON values) as results_dir/NAME.json."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.json"
    write_durably(path, json.dumps(to_json(result), indent=2) + "\n")  # a reader never sees half a file
    print(f"wrote {path}")
    return path


def read_result(results_dir: Path, name: str, kind: type[T] = dict) -> T | None:
    """results_dir/NAME.json as a `kind` (checked against its type hints), or None when it is missing."""
    path = results_dir / f"{name}.json"
    if not path.exists():
        return None
    return from_json(kind, json.loads(path.read_text()), where=str(path))

