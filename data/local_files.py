"""A local folder or file as a corpus: `.txt`/`.raw` text, `.jsonl` (a "text" field), `.parquet` (a "text" column).

Splits come from file names: a file (or a folder on its path) named with `train`, `valid`/`validation`/`val`/
`dev` or `test` as a word belongs to that split (WikiText's `wiki.train.raw`, the hub's
`train-00000-of-00002.parquet`, `data/test/part-0.jsonl`).  A corpus with no validation file has its validation
split, and its test split where it has none either, carved from the training text: every 200th document, from an
offset drawn from a fixed seed, in the same pass that writes the training tokens.  A file or folder whose names
say no split is all training text.

Documents: a text file is cut at WikiText article headings, else at paragraph boundaries once a document is long
(data/documents.py).  A JSON-lines record is a document, and so is a parquet row, except in a parquet file whose
rows are single lines each ending in a newline (the hub's WikiText files): its rows are the lines of one text,
cut as a text file is.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from data.corpus import SPLITS, Corpus, Progress, TextPass
from data.documents import MAX_DOCUMENT_CHARS, DatasetError, DocumentCutter, document_bound, text_blocks

RAW_FILES = {"train": "wiki.train.raw", "validation": "wiki.valid.raw", "test": "wiki.test.raw"}
FORMATS = {".txt": "text", ".raw": "text", ".text": "text", ".jsonl": "jsonl", ".parquet": "parquet"}
SPLIT_WORDS = {"train": "train", "training": "train", "valid": "validation", "validation": "validation",
               "val": "validation", "dev": "validation", "test": "test"}
CARVE_EVERY = 200
CARVE_SEED = 20240520
LINES_PROBE_ROWS = 1000  # rows looked at to tell a table of lines from a table of documents
TABLE_ROWS_PER_READ = 4096
SAMPLED_BLOCKS, SAMPLE_BYTES = 32, 16 << 10
TEXT_FIX = "convert it to UTF-8 (e.g. with iconv) or re-extract it"
# Bumped whenever the cutting into documents or the carving changes, so old token caches are not reused.
CUTTING_VERSION = 2


@dataclass(frozen=True)
class DataFile:
    path: Path
    format: str  # text, jsonl, parquet
    size: int


def split_named(relative: Path) -> str | None:
    """The split a file's name (or a folder on its relative path) says, if any."""
    for part in reversed(relative.parts):
        for word in re.split(r"[^a-z]+", part.lower()):
            if word in SPLIT_WORDS:
                return SPLIT_WORDS[word]
    return None


def content_digest(files: list[DataFile], *settings) -> str:
    """Names the files' content, not their place: sizes and 32 sampled blocks of each (all of a file under
    512 KiB), so a moved or touched corpus keeps its token cache and an edited one (almost surely) does not."""
    digest = hashlib.blake2b(repr(settings).encode(), digest_size=10)
    for f in files:
        digest.update(f"{f.format}:{f.size}".encode())
        with open(f.path, "rb") as stream:
            if f.size <= SAMPLED_BLOCKS * SAMPLE_BYTES:
                digest.update(stream.read())
                continue
            for i in range(SAMPLED_BLOCKS):
                stream.seek(i * (f.size - SAMPLE_BYTES) // (SAMPLED_BLOCKS - 1))
                digest.update(stream.read(SAMPLE_BYTES))
    return digest.hexdigest()


# --- reading each format ------------------------------------------------------------------------

def _parquet_rows(f: DataFile, progress: Progress) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        table = pq.ParquetFile(f.path)
        column = table.schema_arrow.field("text")
    except (pa.ArrowException, OSError, KeyError) as e:  # not parquet, damaged, or without a "text" column
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DatasetError(f"{f.path} is not a readable parquet file with a \"text\" column ({reason}); "
                           f"replace it with the hub's file") from e
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise DatasetError(f"{f.path}: the \"text\" column holds {column.type}, not strings; replace it with the "
                           f"hub's file")
    rows, reported = max(1, table.metadata.num_rows), 0
    done = 0
    for batch in table.iter_batches(batch_size=TABLE_ROWS_PER_READ, columns=["text"]):
        yield from (row or "" for row in batch.column(0).to_pylist())  # a null row is an empty line
        done += batch.num_rows
        progress(f.size * done // rows - reported)
        reported = f.size * done // rows


def _jsonl_rows(f: DataFile, progress: Progress) -> Iterator[str]:
    with open(f.path, "rb") as stream:
        for number, line in enumerate(stream, 1):
            progress(len(line))
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise DatasetError(f"{f.path} line {number} is not a JSON object ({e}); each line must be one "
                                   f"object with a \"text\" field") from e
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise DatasetError(f"{f.path} line {number} has no \"text\" field holding a string; each line "
                                   f"must be one object with a \"text\" field")
            yield text


def _rows_are_lines(rows: list[str]) -> bool:
    return all(row == "" or (row.endswith("\n") and row.count("\n") == 1) for row in rows)


def file_documents(files: list[DataFile], max_chars: int, progress: Progress) -> Iterator[str]:
    """The files' documents in order (see the module's docstring)."""
    cutter = DocumentCutter(max_chars)  # a document ends with its file, except across tables of lines
    for f in files:
        if f.format == "text":
            yield from cutter.finish()
            for piece in text_blocks(f.path, TEXT_FIX, progress):
                yield from cutter.feed(piece)
            yield from cutter.finish()
            continue
        if f.format == "jsonl":
            rows, probe = _jsonl_rows(f, progress), []
        else:
            rows = _parquet_rows(f, progress)
            probe = list(itertools.islice(rows, LINES_PROBE_ROWS))
            rows = itertools.chain(probe, rows)
        if probe and _rows_are_lines(probe):
            while lines := list(itertools.islice(rows, TABLE_ROWS_PER_READ)):
                yield from cutter.feed("".join(lines))
        else:
            yield from cutter.finish()
            for row in rows:
                yield from cutter.feed(row)
                yield from cutter.finish()
    yield from cutter.finish()


# --- the corpus --------------------------------------------------------------------------------------

def corpus_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.suffix in FORMATS
                  and not any(part.startswith(".") for part in p.relative_to(root).parts))


def checked(files: list[DataFile]) -> list[DataFile]:
    for f in files:
        if not f.path.is_file():
            raise DatasetError(f"{f.path} is not a file; it should hold the split's text")
    return files


def carved_split(index: int) -> str:
    """The split of the `index`-th document of a training text that validation and test are carved from."""
    slot = (index + CARVE_SEED) % CARVE_EVERY
    return "validation" if slot == 0 else "test" if slot == 1 else "train"


def carving_read(files: list[DataFile], carved: tuple[str, ...], max_chars: int):
    def read(progress: Progress) -> Iterator[tuple[str, str]]:
        held = None  # the last training document, kept back: a tiny corpus gives it to validation
        gave_validation = False
        for index, doc in enumerate(file_documents(files, max_chars, progress)):
            split = carved_split(index)
            split = split if split in carved else "train"
            if split == "train":
                if held is not None:
                    yield "train", held
                held = doc
                continue
            gave_validation |= split == "validation"
            yield split, doc
        if held is not None:
            yield ("train" if gave_validation else "validation"), held
    return read


def local_corpus(path: str | Path, name: str | None = None) -> Corpus:
    from data.corpus import DATASET_NAMES
    root = Path(path).expanduser().resolve()
    if not root.exists():
        raise DatasetError(f"dataset {str(path)!r} is neither a known name ({', '.join(DATASET_NAMES)}) nor an "
                           f"existing folder or file")
    paths = corpus_files(root)
    if root.is_file() and root.suffix not in FORMATS:
        raise DatasetError(f"{root} is not a corpus file: use .txt or .raw (text), .jsonl (a \"text\" field per "
                           f"line) or .parquet (a \"text\" column)")
    if not paths:
        raise DatasetError(f"{root} holds no corpus files: wiki.*.raw or .txt files, .jsonl files or parquet files "
                           f"(train-*.parquet, validation-*.parquet, test-*.parquet)")
    files = [DataFile(p, FORMATS[p.suffix], p.stat().st_size) for p in paths]
    named = {} if root.is_file() else {f: split_named(f.path.relative_to(root)) for f in files}
    by_split = {s: [f for f in files if named.get(f) == s] for s in SPLITS}
    if not any(by_split.values()):  # no names: all of it is training text
        by_split["train"] = files
    carved = tuple(s for s in ("validation", "test") if not by_split[s]) if not by_split["validation"] else ()
    name = name or f"local:{root}"

    def text_pass(split: str) -> TextPass:
        if carved and by_split["train"] and split in ("train", *carved):
            source = checked(by_split["train"])
            total = sum(f.size for f in source)
            bound = document_bound(total)
            key = content_digest(source, CUTTING_VERSION, "carved", carved, CARVE_EVERY, CARVE_SEED, bound)
            note = (f"{name}: {' and '.join(carved)} carved from the training text (every {CARVE_EVERY}th "
                    f"document from a seeded offset, {100 / CARVE_EVERY:.1f}% each; documents of at most "
                    f"{bound:,} characters)")
            return TextPass(f"local-{key}", ("train", *carved), carving_read(source, carved, bound), total, note)
        source = by_split[split]
        if not source:
            raise DatasetError(f"{root} has no {split} split: expected {RAW_FILES[split]}, {split}-*.parquet or "
                               f"another file whose name says {split!r}" +
                               (", or a training split to carve it from" if split != "train" else ""))
        key = content_digest(checked(source), CUTTING_VERSION, split)

        def read(progress: Progress) -> Iterator[tuple[str, str]]:
            return ((split, doc) for doc in file_documents(source, MAX_DOCUMENT_CHARS, progress))
        return TextPass(f"local-{key}", (split,), read, sum(f.size for f in source))

    return Corpus(name, text_pass)


def whole_file_corpus(path: Path, split: str) -> Corpus:
    """One text file as the given split of a corpus (the leaderboard's --eval-text)."""
    f = DataFile(path, "text", path.stat().st_size)

    def read(progress: Progress) -> Iterator[tuple[str, str]]:
        return ((split, doc) for doc in file_documents([f], MAX_DOCUMENT_CHARS, progress))

    def text_pass(asked: str) -> TextPass:
        if asked != split:
            raise DatasetError(f"{path} is used as the {split} split alone; it has no {asked} split")
        return TextPass(f"text-{content_digest([f], CUTTING_VERSION, split)}", (split,), read, f.size)
    return Corpus(f"text:{path.name}", text_pass)
