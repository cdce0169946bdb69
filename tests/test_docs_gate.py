"""The docs gate of `make test` (its `mkdocs build` line, run as the Makefile writes it) fails on a broken link: one
planted in a page and one image planted in bench/REPORT.md, which the site carries (docs/repo_links.py).  The site is
built from a copy of what it reads, so the planting leaves the checkout alone."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def gate_command() -> tuple[dict, list[str]]:
    """(its environment settings, its words) of the Makefile's `mkdocs build` line in the `test` recipe."""
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    words = shlex.split(next(line for line in recipe.splitlines() if "mkdocs build" in line))
    settings = dict(word.split("=", 1) for word in words if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", word))
    tool = next(i for i, word in enumerate(words) if word.endswith("/mkdocs"))
    return settings, [sys.executable, "-m", "mkdocs", *words[tool + 1:]]


def site_sources(folder: Path) -> Path:
    """A copy of what the site reads: mkdocs.yml, docs/, configs/ and the report with its plots."""
    for name in ("mkdocs.yml",):
        shutil.copy(ROOT / name, folder / name)
    for name in ("docs", "configs"):
        shutil.copytree(ROOT / name, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "bench/results", folder / "bench/results",
                    ignore=lambda where, names: [n for n in names if not n.endswith(".png")
                                                 and not (Path(where) / n).is_dir()])
    shutil.copy(ROOT / "bench/REPORT.md", folder / "bench/REPORT.md")
    return folder


def build(folder: Path) -> subprocess.CompletedProcess:
    settings, command = gate_command()
    return subprocess.run(command, cwd=folder, env={**os.environ, **settings}, capture_output=True, text=True,
                          timeout=300)


def test_the_gate_keeps_its_warnings():
    settings, command = gate_command()
    assert "--strict" in command and "--quiet" not in command and "-q" not in command


def test_the_docs_gate_passes_as_shipped_and_fails_on_a_planted_broken_link(tmp_path):
    folder = site_sources(tmp_path)
    shipped = build(folder)
    assert shipped.returncode == 0, shipped.stderr[-3000:]
    with open(folder / "docs/training.md", "a") as page:
        page.write("\nSee [the planted page](planted-nowhere.md).\n")
    with open(folder / "bench/REPORT.md", "a") as report:
        report.write("\n![a planted plot](results/gpu/planted_nowhere.png)\n")
    planted = build(folder)
    assert planted.returncode != 0
    assert "planted-nowhere.md" in planted.stderr and "planted_nowhere.png" in planted.stderr, planted.stderr[-3000:]
