"""MkDocs hook: the pages link to the repository's own files (`../bench/REPORT.md`, `../configs/demo/train.toml`) so
that the links work where the Markdown is read as it is; the site gets those files too, and the links are pointed
at them.  A link to a file that is not there stays as written, and `mkdocs build --strict` fails on it."""
from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# The repository's files the site carries: the benchmark report with its plots, and the run configs.
CARRIED = ("bench/REPORT.md", "bench/results/**/*.png", "configs/*/*.toml")
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


def on_files(files, config):
    for pattern in CARRIED:
        for path in sorted(ROOT.glob(pattern)):
            files.append(File(path.relative_to(ROOT).as_posix(), str(ROOT), config["site_dir"],
                              config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    source = Path(page.file.abs_src_path)
    if DOCS not in source.parents:  # a carried file: its links are the repository's, and so the site's
        return markdown

    def pointed(match):
        target = match.group(2)
        if "://" in target or target.startswith("mailto:"):
            return match.group(0)
        resolved = (source.parent / target).resolve()
        if DOCS in resolved.parents or not resolved.is_file() or ROOT not in resolved.parents:
            return match.group(0)
        in_site = os.path.relpath(resolved.relative_to(ROOT), Path(page.file.src_uri).parent)
        return f"{match.group(1)}{Path(in_site).as_posix()}{match.group(3) or ''}{match.group(4)}"

    return LINK.sub(pointed, markdown)
