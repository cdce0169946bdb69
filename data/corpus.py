"""Corpora: where a split's text comes from, read as a stream of documents in bounded memory.

Dataset names (the `--dataset` flag everywhere):
- `builtin`: the Python standard library's documentation (below);
- `wikitext-103`, `wikitext-2`: WikiText through the `datasets` library, from its cache or the hub;
- a local folder or file of `.txt`/`.raw` text, `.jsonl` (a "text" field) or `.parquet` (a "text" column), each
  also compressed (data/local_files.py);
- `hf:OWNER/NAME[/SUBFOLDER]` (or `OWNER/NAME` where no such local path exists): a Hugging Face dataset
  repository's data files, from the hub or its cache, read as a local folder.

Each corpus hands out `TextPass`es (data/corpus_types.py): one read of some text that writes one or more splits
(a corpus without a validation split has it carved from the training text in the same pass).  A pass's `key`
names its content and how it is cut into documents, so token caches are reused while the content is the same,
wherever it lies.
"""
from __future__ import annotations

import ast
import sys
import sysconfig
import zlib
from pathlib import Path
from typing import Callable, Iterator

from data.corpus_types import DATASET_NAMES, SPLITS, Corpus, Progress, TextPass
from data.documents import DatasetError, DocumentCutter
from data.hub_access import hub_access
from data.local_files import local_corpus

__all__ = ["SPLITS", "DATASET_NAMES", "DATASET_FORMATS", "DatasetError", "Corpus", "TextPass", "get_corpus", "builtin_corpus",
           "local_dataset_path"]

HUB_CONFIGS = {"wikitext-103": "wikitext-103-raw-v1", "wikitext-2": "wikitext-2-raw-v1"}
HUB_REPO = "Salesforce/wikitext"
# Every form --dataset takes and what it reads, in one place: the tools' --help (`dataset_help`) and docs/data.md's
# table of formats (`formats_table`; tests/test_data.py checks the page holds it) are both written from it.
DATASET_FORMATS = (
    ("FOLDER", "its .txt/.raw text, .jsonl (a \"text\" field per line) and .parquet (a \"text\" column) files, in "
               "any mix; a file whose name says train, valid/validation/val/dev or test is that split, any other is "
               "training text, and a missing validation split is carved from the training text"),
    ("FILE.txt, FILE.raw, FILE.jsonl, FILE.parquet", "a single file, as a folder holding only it"),
    ("hf:OWNER/NAME[/SUBFOLDER]", "a dataset repository on the Hugging Face hub, downloaded once and read as a "
                                  "folder (OWNER/NAME alone where no such local path exists)"),
    ("builtin", "the docstrings of Python's standard library: offline, always there"),
    ("wikitext-103, wikitext-2", "WikiText (Salesforce/wikitext) through the datasets library, from its cache or "
                                 "the hub"),
)


def dataset_help() -> str:
    """--dataset's help text, the same in every tool."""
    return "; ".join(f"{form}: {what}" for form, what in DATASET_FORMATS)


def formats_table() -> str:
    """docs/data.md's table of the forms --dataset takes (markdown)."""
    rows = [f"| `{form}` | {what} |" for form, what in DATASET_FORMATS]
    return "\n".join(["| `--dataset` | reads |", "|---|---|", *rows])
HUB_ROWS_PER_READ = 4096


def single_split_pass(key: str, split: str, documents: Callable[[Progress], Iterator[str]], origin: str) -> TextPass:
    return TextPass(key, (split,), lambda progress: ((split, d) for d in documents(progress)), None, {split: origin})


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


def builtin_documents(split: str, progress: Progress = lambda n: None) -> Iterator[str]:
    """Python standard library documentation: every docstring of the stdlib sources (read with
    `ast`, nothing imported), one document per module, plus pydoc's topic pages: English text, offline and
    always there.  Modules are assigned to splits by a stable hash of their path (90/5/5).
    `progress` gets the characters of each document yielded (the sources' other bytes are not text)."""
    root = _stdlib_root()
    # site-packages is not walked (an interpreter's own packages can hold several times the stdlib's files);
    # the order is the same: every path sorted whole.
    paths = [p for top in root.iterdir() if top.name != "site-packages"
             for p in ([top] if top.is_file() else top.rglob("*.py")) if p.suffix == ".py"]
    for path in sorted(paths):
        rel = path.relative_to(root).as_posix()
        if _builtin_split(rel) != split:
            continue
        docs = _docstrings(path.read_text(encoding="utf-8", errors="replace"))
        if docs:
            document = "\n\n".join(docs)
            progress(len(document))
            yield document
    from pydoc_data.topics import topics
    for name in sorted(topics):
        if _builtin_split(f"pydoc_data/{name}") == split:
            progress(len(topics[name]))
            yield topics[name]


def builtin_corpus() -> Corpus:
    version = ".".join(map(str, sys.version_info[:3]))
    return Corpus("builtin", lambda split: single_split_pass(
        f"python-stdlib-docs-{version}", split, lambda progress: builtin_documents(split, progress),
        f"the docstrings of Python {version}'s standard library, the {split} share of its modules"))


# --- WikiText from the hub ---------------------------------------------------------------------

def _hub_error(what: str, where: str, e: Exception) -> DatasetError:
    return DatasetError(
        f"could not load {what} from {where}: {type(e).__name__}: {e}\nAlternatives: pass --dataset PATH to a "
        f"local folder holding wiki.train.raw / wiki.valid.raw / wiki.test.raw (or the hub's parquet files), or "
        f"--dataset builtin for the built-in Python-documentation corpus.")


def hub_corpus(name: str) -> Corpus:
    config = HUB_CONFIGS[name]

    def documents(split: str, progress: Progress) -> Iterator[str]:
        import datasets
        access, offline_because = hub_access()
        where = f"its cache (offline: {offline_because})" if offline_because else "the Hugging Face hub or its cache"
        try:
            with access:
                ds = datasets.load_dataset(HUB_REPO, config, split=split)
        except Exception as e:  # the hub and cache raise many types (ConnectionError, FileNotFoundError, ...)
            raise _hub_error(f"{name} ({HUB_REPO}/{config}, split {split})", where, e) from e
        # The rows are WikiText's lines; the table is memory-mapped, so a slice of rows at a time is in memory.
        cutter = DocumentCutter()
        for start in range(0, len(ds), HUB_ROWS_PER_READ):
            text = "".join(line or "" for line in ds[start:start + HUB_ROWS_PER_READ]["text"])
            progress(len(text))  # characters: the bytes of the hub's files are not known here
            yield from cutter.feed(text)
        yield from cutter.finish()

    # "-c2": the second way of cutting documents (data/documents.py), so caches of the first are not reused.
    return Corpus(name, lambda split: single_split_pass(f"hub-{config}-c2", split,
                                                        lambda progress: documents(split, progress),
                                                        f"{HUB_REPO} {config}, its {split} split"))


# --- any dataset repository on the hub -------------------------------------------------------------

HUB_DATA_FILES = tuple(f"*{suffix}{compressed}" for suffix in (".txt", ".raw", ".jsonl", ".parquet")
                       for compressed in ("", ".gz", ".bz2", ".xz", ".zst"))


def hub_repository_corpus(spec: str) -> Corpus:
    """`OWNER/NAME[/SUBFOLDER]`: the repository's text, JSON-lines and parquet files (under SUBFOLDER),
    downloaded once into the hub's cache (to disk, never into memory) and then read as a local folder."""
    owner, _, rest = spec.partition("/")
    name, _, subfolder = rest.partition("/")
    if not owner or not name:
        raise DatasetError(f"hf:{spec} does not name a dataset repository; write hf:OWNER/NAME[/SUBFOLDER]")
    repo_id = f"{owner}/{name}"
    from huggingface_hub import snapshot_download
    access, offline_because = hub_access()
    where = f"the hub's cache (offline: {offline_because})" if offline_because else "the Hugging Face hub"
    patterns = [f"{subfolder.rstrip('/')}/**/{p}" if subfolder else p for p in HUB_DATA_FILES]
    patterns += [f"{subfolder.rstrip('/')}/{p}" for p in HUB_DATA_FILES] if subfolder else []
    try:
        with access:
            folder = Path(snapshot_download(repo_id, repo_type="dataset", allow_patterns=patterns))
    except Exception as e:  # network, authentication, unknown repository, missing cache
        raise DatasetError(f"could not load the dataset repository {repo_id!r} from {where}: {type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}\nAlternatives: a local folder or file "
                           f"(--dataset PATH), or --dataset builtin.") from e
    return local_corpus(folder / subfolder if subfolder else folder, name=f"hf:{spec}")


def local_dataset_path(name: str) -> Path | None:
    """The folder or file `get_corpus` reads for the dataset `name` when it is a local one; None for the built-in
    corpus, WikiText and the hub's repositories."""
    if name == "builtin" or name in HUB_CONFIGS or name.startswith("hf:"):
        return None
    if not Path(name).exists() and name.count("/") == 1 and not name.startswith((".", "/", "~")):
        return None
    return Path(name).expanduser()


def get_corpus(name: str) -> Corpus:
    if name == "builtin":
        return builtin_corpus()
    if name in HUB_CONFIGS:
        return hub_corpus(name)
    if name.startswith("hf:"):
        return hub_repository_corpus(name[3:])
    local = local_dataset_path(name)
    return hub_repository_corpus(name) if local is None else local_corpus(name)
