"""The report's Markdown: a page that sections append to, tables, and how numbers are written."""
from __future__ import annotations

import os
from pathlib import Path

from runtime.timing import Spread

MiB = 2**20


class Page:
    """Markdown text in the making; images are linked relative to where the page will be written."""

    def __init__(self, out: Path):
        self.out = out
        self.parts: list[str] = []

    def add(self, text: str) -> None:
        self.parts.append(text)

    def table(self, header: list[str], rows: list[list]) -> None:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        self.add("\n".join(lines) + "\n")

    def image(self, path: Path) -> None:
        self.add(f"![{path.name}]({os.path.relpath(path, self.out.parent)})\n")

    def text(self) -> str:
        return "\n".join(self.parts) + "\n"


def num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def spread(s: Spread | None, digits: int = 1, scale: float = 1.0) -> str:
    """The median with its range: 1,234.5 (1,200.0-1,250.1)."""
    if s is None:
        return "n/a"
    return f"{s.median * scale:,.{digits}f} ({s.min * scale:,.{digits}f}-{s.max * scale:,.{digits}f})"


def mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / MiB:,.0f}"


def decode_path(mode: str) -> str:
    """Which decode path a speed row timed (issue 70): `auto` is what a user's `generate()`, sample.py and the server
    run unless told otherwise, with its run-time choices (trace or not, threads, kernels); any other is a fixed mode."""
    if mode == "auto":
        return "the user's default (decode `auto`)"
    return f"fixed: decode `{mode}`"


def timed_as(path: str, warm_ups: str) -> str:
    """The sentence above a speed table whose rows were all timed alike: the path (the user's default or a fixed mode)
    and whether the processes' warm-ups overlapped."""
    return f"**Path timed:** {path}. **Warm-ups:** {warm_ups}.\n"
