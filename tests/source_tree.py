"""The project's Python sources, for the tests that read them rather than run them (tests/test_import_cycles.py,
tests/test_prose_figures.py)."""
from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Besides these, every hidden folder is skipped (.venv, .cache, .peers: installed or fetched code, not ours).
NOT_SOURCES = {"out", "__pycache__"}


def python_files(*under: str) -> list[Path]:
    """Every .py file of the project (under the given folders or files, relative to the root; all by default)."""
    found = []
    for start in [ROOT / name for name in under] or [ROOT]:
        if start.is_file():
            found.append(start)
            continue
        for folder, subfolders, files in os.walk(start):
            subfolders[:] = [name for name in subfolders if not name.startswith(".") and name not in NOT_SOURCES]
            found += [Path(folder) / name for name in files if name.endswith(".py")]
    return sorted(found)


def module_name(path: Path) -> str:
    """bench/experiments/__init__.py -> bench.experiments; train.py -> train."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))
