"""Text sources, each yielding documents per split: WikiText (hub, cache or local folder) and a built-in corpus.

Dataset names (the `--dataset` flag everywhere): `wikitext-103`, `wikitext-2`,
`builtin`, or a path to a local folder in WikiText's layout.
"""
from __future__ import annotations

import ast
import hashlib
import re
import sys
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from data.hub_access import hub_access
from runtime.errors import UserError
from runtime.text import decode_utf8

SPLITS = ("train", "validation", "test")
HUB_CONFIGS = {"wikitext-103": "wikitext-103-raw-v1", "wikitext-2": "wikitext-2-raw-v1"}
HUB_REPO = "Salesforce/wikitext"
RAW_FILES = {"train": "wiki.train.raw", "validation": "wiki.valid.raw", "test": "wiki.test.raw"}
# An article starts at a top-level heading line such as " = Valkyria Chronicles III = ".
ARTICLE_HEADING = re.compile(r"^ = [^=].* = $")


class DatasetError(UserError, ValueError):
    pass


@dataclass(frozen=True)
class Corpus:
    name: str
    # Identifies the exact content, so token caches are rebuilt when it changes.
    fingerprint: str
    documents: Callable[[str], Iterator[str]]


def split_articles(text: str) -> Iterator[str]:
    """WikiText's text cut into articles at top-level headings."""
    article: list[str] = []
    for line in text.splitlines(keepends=True):
        if ARTICLE_HEADING.match(line.rstrip("\n")) and any(l.strip() for l in article):
            yield "".join(article)
            article = []
        article.append(line)
    if any(l.strip() for l in article):
        yield "".join(article)


def read_text_file(path: Path) -> str:
    """A dataset text file (WikiText's `wiki.*.raw`, a leaderboard --eval-text), checked to be a readable
    UTF-8 file; newlines as text mode reads them, so its tokens match those of earlier versions."""
    if not path.is_file():
        raise DatasetError(f"{path} is not a file; it should hold the split's text (UTF-8)")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DatasetError(f"{path} cannot be read ({e.strerror}); check its permissions") from e
    return decode_utf8(data, path, "WikiText's raw files are UTF-8, so re-extract it (or convert it, e.g. with "
                                   "iconv)", DatasetError)


# --- the built-in corpus ----------------------------------------------------------------------

def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _builtin_split(relative_path: str) -> str:
    bucket = zlib.crc32(relative_path.encode()) % 20
    return "validation" if bucket == 0 else "test" if bucket == 1 else "train"


def _docstrings(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    nodes = (n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                                           ast.AsyncFunctionDef)))
    return [d for d in (ast.get_docstring(n) for n in nodes) if d]


def builtin_documents(split: str) -> Iterator[str]:
    """Python standard library documentation: every docstring of the stdlib sources (read with
    `ast`, nothing imported), one document per module, plus pydoc's topic pages.  About 2.7 MB of
    English text.  Modules are assigned to splits by a stable hash of their path (90/5/5)."""
    root = _stdlib_root()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("site-packages/") or _builtin_split(rel) != split:
            continue
        docs = _docstrings(path.read_text(encoding="utf-8", errors="replace"))
        if docs:
            yield "\n\n".join(docs)
    from pydoc_data.topics import topics
    for name in sorted(topics):
        if _builtin_split(f"pydoc_data/{name}") == split:
            yield topics[name]


def builtin_corpus() -> Corpus:
    version = ".".join(map(str, sys.version_info[:3]))
    return Corpus(name="builtin", fingerprint=f"python-stdlib-docs-{version}", documents=builtin_documents)


# --- WikiText ----------------------------------------------------------------------------------

def _local_parquet_files(folder: Path, split: str) -> list[Path]:
    # The hub's layout: <config>/<split>-00000-of-00002.parquet (or directly in the folder).
    return sorted(p for p in folder.rglob(f"{split}-*.parquet"))


def _parquet_lines(path: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        column = pq.read_table(path, columns=["text"]).column("text")
    except (pa.ArrowException, OSError) as e:  # not parquet, damaged, or without a "text" column
        raise DatasetError(f"{path} is not a readable parquet file with a \"text\" column "
                           f"({str(e).splitlines()[0]}); replace it with the hub's file") from e
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise DatasetError(f"{path}: the \"text\" column holds {column.type}, not strings; replace it with the "
                           f"hub's file")
    return [line or "" for line in column.to_pylist()]  # a null row is an empty line


def local_corpus(folder: str | Path) -> Corpus:
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise DatasetError(f"dataset {str(folder)!r} is neither a known name ({', '.join(DATASET_NAMES)}) "
                           f"nor an existing folder")
    files = sorted(p for p in folder.rglob("*") if p.suffix in (".raw", ".parquet"))
    if not files:
        raise DatasetError(f"{folder} holds neither wiki.*.raw files nor hub-layout parquet files "
                           f"(train-*.parquet, validation-*.parquet, test-*.parquet)")
    stamp = hashlib.sha1("".join(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files).encode())

    def documents(split: str) -> Iterator[str]:
        raw = folder / RAW_FILES[split]
        if raw.exists():
            yield from split_articles(read_text_file(raw))
            return
        parquet = _local_parquet_files(folder, split)
        if not parquet:
            raise DatasetError(f"{folder} has no {split} split: expected {RAW_FILES[split]} or "
                               f"{split}-*.parquet")
        yield from split_articles("".join(line for p in parquet for line in _parquet_lines(p)))

    return Corpus(name=f"local:{folder}", fingerprint=f"local-{folder.name}-{stamp.hexdigest()[:12]}",
                  documents=documents)


def hub_corpus(name: str) -> Corpus:
    config = HUB_CONFIGS[name]

    def documents(split: str) -> Iterator[str]:
        import datasets
        access, offline_because = hub_access()
        where = f"its cache (offline: {offline_because})" if offline_because else "the Hugging Face hub or its cache"
        try:
            with access:
                ds = datasets.load_dataset(HUB_REPO, config, split=split)
        except Exception as e:  # the hub and cache raise many types (ConnectionError, FileNotFoundError, ...)
            raise DatasetError(
                f"could not load {name} ({HUB_REPO}/{config}, split {split}) from {where}: "
                f"{type(e).__name__}: {e}\nAlternatives: pass --dataset PATH to a local folder holding "
                f"wiki.train.raw / wiki.valid.raw / wiki.test.raw (or the hub's parquet files), or "
                f"--dataset builtin for the built-in Python-documentation corpus.") from e
        yield from split_articles("".join(ds["text"]))

    return Corpus(name=name, fingerprint=f"hub-{config}", documents=documents)


DATASET_NAMES = ("wikitext-103", "wikitext-2", "builtin")


def get_corpus(name: str) -> Corpus:
    if name == "builtin":
        return builtin_corpus()
    if name in HUB_CONFIGS:
        return hub_corpus(name)
    return local_corpus(name)
