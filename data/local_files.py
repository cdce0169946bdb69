"""A local folder or file as a corpus: `.txt`/`.raw` text, `.jsonl` (a "text" field), `.parquet` (a "text" column),
each also compressed whole (`.gz`, `.bz2`, `.xz`, `.zst`: data/compressed.py).

Splits come from file names: a file (or a folder on its path) named with `train`, `valid`/`validation`/`val`/`dev`
or `test` as a word belongs to that split (WikiText's `wiki.train.raw`, the hub's `train-00000-of-00002.parquet`,
`data/test/part-0.jsonl`); any other corpus file is training text.  A corpus with no validation file has its
validation split, and its test split where it has none either, carved from the training text: every 200th document,
from an offset drawn from a fixed seed, in the same pass that writes the training tokens.  Extensions match in any
case (`.RAW`, `.Txt`).  A symbolic link is followed wherever it points (the hub's cache links every file to a blob
outside its folder).

Nothing in a folder is passed over without a word.  A file that cannot be used as text -- another format (`.csv`,
`.json`, a name without an extension), a dangling or looping link, a link to a folder, anything that is not a
regular file (a FIFO would block the read forever) -- is named with the reason, in one line, and the corpus is
refused unless the run asked to go on without them (`skipping_unreadable`, train.py's --skip-unreadable), when the
line says which were left out.  Hidden files and folders (a name starting with ".") are the one silent skip; a
training run's folder (one holding training_state/) inside the corpus is refused, as its metrics and checkpoints
would otherwise be read as text.

Documents: a text file is cut at WikiText article headings, else at paragraph boundaries once a document is long
(data/documents.py).  A JSON-lines record is a document, and so is a parquet row, except in a parquet file whose
rows are single lines each ending in a newline (the hub's WikiText files): its rows are the lines of one text,
cut as a text file is.
"""
from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
import itertools
import os
import re
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

import xxhash

from data.compressed import COMPRESSIONS, READ_ERRORS, compression_of, inner_suffix, open_stream
from data.corpus_types import DATASET_NAMES, SPLITS, Corpus, Progress, TextPass
from data.documents import (MAX_DOCUMENT_CHARS, DatasetError, DocumentCutter, document_bound, text_blocks,
                            unreadable_stream)
from storage.training_state import TRAINING_STATE
from runtime.parsed import Unparsable, json_value

RAW_FILES = {"train": "wiki.train.raw", "validation": "wiki.valid.raw", "test": "wiki.test.raw"}
FORMATS = {".txt": "text", ".raw": "text", ".text": "text", ".jsonl": "jsonl", ".parquet": "parquet"}
SPLIT_WORDS = {"train": "train", "training": "train", "valid": "validation", "validation": "validation",
               "val": "validation", "dev": "validation", "test": "test"}
CARVE_EVERY = 200
CARVE_SEED = 20240520
LINES_PROBE_ROWS = 1000  # rows looked at to tell a table of lines from a table of documents
# A JSON line is one record, a document, which is cut into pieces of MAX_DOCUMENT_CHARS once read: a book is a few
# MB, and a line past this bound is refused before it is held whole.
MAX_LINE_BYTES = 32 << 20
TABLE_ROWS_PER_READ = 4096
HASH_READ_BYTES = 1 << 20
PARQUET_MAGIC = b"PAR1"
DISK_LEFT_FREE_BYTES = 1 << 30  # a compressed parquet file's decompressed copy stops short of this much free space
LISTED_FILES = 3  # files named in a pass's note; the rest are counted
LISTED_UNUSABLE = 10  # files named, with their reasons, in the line about those that cannot be used
TEXT_FIX = "convert it to UTF-8 (e.g. with iconv) or re-extract it"
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# Bumped whenever the cutting into documents, the carving, the choice of files or the content key changes, so old
# token caches are not reused.
CUTTING_VERSION = 4
NO_TEXT = xxhash.xxh3_128().hexdigest()


READ_FORMATS = (".txt/.raw/.text, .jsonl or .parquet, each also compressed (" +
                ", ".join(COMPRESSIONS) + ")")
# Set for a run that goes on without the files it cannot use (train.py's --skip-unreadable); otherwise they stop it.
_skip_unreadable = contextvars.ContextVar("skip_unreadable", default=False)
# The folders whose left-out files this process has named, so a run's several reads of a corpus say it once.
ANNOUNCED: set[tuple[Path, tuple[Path, ...]]] = set()


@contextlib.contextmanager
def skipping_unreadable(skip: bool = True):
    """Within the block, a corpus folder's files that cannot be used as text are named and left out instead of
    refusing the corpus."""
    token = _skip_unreadable.set(skip)
    try:
        yield
    finally:
        _skip_unreadable.reset(token)


@dataclass(frozen=True)
class DataFile:
    path: Path
    format: str  # text, jsonl, parquet
    size: int
    compression: str | None = None  # gzip, bzip2, xz, zstd (data/compressed.py)


def split_named(relative: Path) -> str | None:
    """The split a file's name (or a folder on its relative path) says, if any."""
    for part in reversed(relative.parts):
        for word in re.split(r"[^a-z]+", part.lower()):
            if word in SPLIT_WORDS:
                return SPLIT_WORDS[word]
    return None


def content_digest(files: list[DataFile], *settings) -> str:
    """Names the files' content, not their place: each file's format, size and a hash of all its bytes, so a moved
    or touched corpus keeps its token cache and any edit, wherever it falls, gives a new one."""
    digest = xxhash.xxh3_128(repr(settings).encode())
    for f in files:  # a compressed file's bytes as they are on disk: they name its text as well
        kind = f"{f.format}+{f.compression}" if f.compression else f.format
        digest.update(f"{kind}:{f.size}:{file_hash(f.path)}".encode())
    return digest.hexdigest()


def file_hash(path: Path) -> str:
    """xxh3-128 of the file's bytes.  Within a process a file is hashed once while its inode, size and times stay
    the same: a training start asks for the same corpus's key several times."""
    try:
        status = path.stat()
        return _hash_once(str(path), (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns,
                                      status.st_ctime_ns))
    except OSError as e:
        raise DatasetError(f"{path} cannot be read ({e.strerror or e}); check its permissions") from e


@functools.lru_cache(maxsize=4096)
def _hash_once(path: str, identity: tuple) -> str:
    digest, buffer = xxhash.xxh3_128(), bytearray(HASH_READ_BYTES)
    view = memoryview(buffer)
    with open(path, "rb") as stream:
        while n := stream.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def size_text(n: int) -> str:
    if n < 1000:
        return f"{n} bytes"
    if n < 1_000_000:
        return f"{n / 1e3:.0f} KB"
    return f"{n / 1e6:.1f} MB" if n < 1_000_000_000 else f"{n / 1e9:.2f} GB"


def files_listed(files: list[DataFile], root: Path) -> str:
    """The files with their sizes, e.g. "train.txt (78 KB), books.txt (44.0 MB)"; past a few, the rest counted."""
    def name(f: DataFile) -> str:
        return f.path.name if f.path == root else str(f.path.relative_to(root))
    listed = ", ".join(f"{name(f)} ({size_text(f.size)})" for f in files[:LISTED_FILES])
    rest = files[LISTED_FILES:]
    if rest:
        listed += f" and {len(rest)} more ({size_text(sum(f.size for f in rest))})"
    return listed


# --- reading each format ------------------------------------------------------------------------

def _parquet_rows(f: DataFile, progress: Progress) -> Iterator[str]:
    if f.compression is None:
        yield from _table_rows(f, f.path, progress)
        return
    # A parquet file is read from its end (the footer) and by page: decompressed first into a file of its own.
    with tempfile.NamedTemporaryFile(prefix="corpus-", suffix=".parquet") as plain:
        try:
            with open_stream(f.path, f.compression) as (stream, _):
                _decompress_checked(f, stream, plain)
            plain.flush()
        except READ_ERRORS as e:
            raise unreadable_stream(f.path, f.compression, e) from e
        yield from _table_rows(f, Path(plain.name), progress)


def _decompress_checked(f: DataFile, stream: BinaryIO, plain) -> None:
    """Copy a compressed parquet file's bytes into `plain`, checked on the way: it starts as parquet does (PAR1),
    and it stops before it takes the last of the temporary folder's free space (a small file can expand a
    thousandfold, and a full disk fails every process on the host)."""
    head = stream.read(len(PARQUET_MAGIC))
    if head != PARQUET_MAGIC:
        raise DatasetError(f"{f.path} is not a compressed parquet file (its text starts {head!r}, not "
                           f"{PARQUET_MAGIC!r}); replace it with the hub's file")
    plain.write(head)
    room = shutil.disk_usage(Path(plain.name).parent).free - DISK_LEFT_FREE_BYTES
    written = len(head)
    while block := stream.read(HASH_READ_BYTES):
        written += len(block)
        if written > room:
            raise DatasetError(f"{f.path} decompresses to more than the {size_text(max(room, 0))} that "
                               f"{Path(plain.name).parent} has free (less {size_text(DISK_LEFT_FREE_BYTES)} left "
                               f"for others); decompress it yourself where there is room, or set TMPDIR to such a "
                               f"folder")
        plain.write(block)


def _table_rows(f: DataFile, path: Path, progress: Progress) -> Iterator[str]:
    """The rows of the parquet file at `path` (`f`'s, decompressed where it is compressed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        table = pq.ParquetFile(path)
        column = table.schema_arrow.field("text")
    except (pa.ArrowException, OSError, KeyError) as e:  # not parquet, damaged, or without a "text" column
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DatasetError(f"{f.path} is not a readable parquet file with a \"text\" column ({reason}); "
                           f"replace it with the hub's file") from e
    if not _holds_strings(column.type):
        raise DatasetError(f"{f.path}: the \"text\" column holds {column.type}, not strings; replace it with the "
                           f"hub's file")
    rows, reported = max(1, table.metadata.num_rows), 0
    done = 0
    for texts in _column_texts(table, f):
        yield from (row or "" for row in texts)  # a null row is an empty line
        done += len(texts)
        progress(f.size * done // rows - reported)
        reported = f.size * done // rows


def _column_texts(table, f: DataFile) -> Iterator[list]:
    """The "text" column a batch of rows at a time; a damaged page, seen only when it is read, is a DatasetError."""
    import pyarrow as pa
    batches, done = table.iter_batches(batch_size=TABLE_ROWS_PER_READ, columns=["text"]), 0
    while True:
        try:
            batch = next(batches, None)
            texts = batch.column(0).to_pylist() if batch is not None else None
        except (pa.ArrowException, OSError, ValueError, IndexError) as e:  # ValueError: bytes that are not UTF-8
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise DatasetError(f"{f.path} is damaged after row {done:,} ({reason}); replace it with the hub's "
                               f"file") from e
        if texts is None:
            return
        yield texts
        done += len(texts)


def _holds_strings(column_type) -> bool:
    """A column of text however arrow stores it: plain, large, view, or dictionary-encoded strings."""
    import pyarrow as pa
    if pa.types.is_dictionary(column_type):
        column_type = column_type.value_type
    return (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)
            or pa.types.is_string_view(column_type))


def _lines(f: DataFile, progress: Progress) -> Iterator[bytes]:
    """The file's lines as bytes (decompressed), calling `progress` with the file's bytes each took.  A line is read
    with a bound: a line longer than MAX_LINE_BYTES is an error naming it, before it is held whole (a .jsonl.gz of
    one short megabyte can hold a line of a gigabyte)."""
    with open_stream(f.path, f.compression) as (stream, raw):
        reported = 0
        for number in itertools.count(1):
            try:
                line = stream.readline(MAX_LINE_BYTES + 1)
            except READ_ERRORS as e:
                raise unreadable_stream(f.path, f.compression, e) from e
            if not line:
                return
            if len(line) > MAX_LINE_BYTES:
                raise DatasetError(f"{f.path} line {number} is longer than {size_text(MAX_LINE_BYTES)}, the most a "
                                   f"line (one record) may hold; split its text into several records")
            if f.compression is None:
                progress(len(line))
            elif (position := raw.tell()) != reported:
                progress(position - reported)
                reported = position
            yield line


def _jsonl_rows(f: DataFile, progress: Progress) -> Iterator[str]:
    for number, line in enumerate(_lines(f, progress), 1):
        if not line.strip():
            continue
        try:
            record = json_value(line)
        except Unparsable as e:
            raise DatasetError(f"{f.path} line {number} is not a JSON object ({e}); each line must be one "
                               f"object with a \"text\" field") from e
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise DatasetError(f"{f.path} line {number} has no \"text\" field holding a string; each line "
                               f"must be one object with a \"text\" field")
        if surrogate := LONE_SURROGATE.search(text):  # valid JSON ("\\ud800"), but no text can be encoded
            raise DatasetError(f"{f.path} line {number}: its \"text\" holds a lone surrogate "
                               f"(\\u{ord(surrogate[0]):04x}), half of a character; remove it or re-export the "
                               f"file with whole characters")
        yield text


def _rows_are_lines(rows: list[str]) -> bool:
    return all(row == "" or (row.endswith("\n") and row.count("\n") == 1) for row in rows)


def file_documents(files: list[DataFile], max_chars: int, progress: Progress) -> Iterator[str]:
    """The files' documents in order (see the module's docstring).  Two files whose text is the same (a file and
    its .gz copy: different bytes, so `refuse_same_bytes` let them through) are refused when the second ends, before
    the pass's token file is complete."""
    cutter = DocumentCutter(max_chars)  # a document ends with its file, except across tables of lines
    texts: dict[tuple[str, str], Path] = {}  # (format, digest of the text read) -> the file that held it
    for f in files:
        digest = xxhash.xxh3_128()
        if f.format == "text":
            yield from cutter.finish()
            for piece in text_blocks(f.path, TEXT_FIX, progress, f.compression):
                digest.update(piece.encode("utf-8", "surrogatepass"))  # blocks joined: they fall anywhere
                yield from cutter.feed(piece)
            yield from cutter.finish()
        else:
            rows = _rows_hashed(_jsonl_rows(f, progress) if f.format == "jsonl" else _parquet_rows(f, progress),
                                digest)
            probe = list(itertools.islice(rows, LINES_PROBE_ROWS)) if f.format == "parquet" else []
            rows = itertools.chain(probe, rows)
            if probe and _rows_are_lines(probe):
                while lines := list(itertools.islice(rows, TABLE_ROWS_PER_READ)):
                    yield from cutter.feed("".join(lines))
            else:
                yield from cutter.finish()
                for row in rows:
                    yield from cutter.feed(row)
                    yield from cutter.finish()
        key = (f.format, digest.hexdigest())
        if key[1] == NO_TEXT:  # empty files are alike without being copies
            continue
        if key in texts:
            first = texts[key]
            raise same_text_refused(first, f.path, Path(os.path.commonpath([first, f.path])),
                                    "the same text once decompressed")
        texts[key] = f.path
    yield from cutter.finish()


def _rows_hashed(rows: Iterator[str], digest) -> Iterator[str]:
    """`rows`, each added to `digest` with its length, so that rows cut differently never hash the same."""
    for row in rows:
        encoded = row.encode("utf-8", "surrogatepass")
        digest.update(len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
        yield row


# --- the corpus --------------------------------------------------------------------------------------

def corpus_files(root: Path) -> tuple[list[Path], dict[Path, str]]:
    """The files under `root` that can be read as text (sorted), and those that cannot, each with the reason.
    Hidden entries are passed over; a folder holding a training run is refused (`run_folder_refused`)."""
    if not root.is_dir():
        return [root], {}
    if (root / TRAINING_STATE).is_dir():
        raise run_folder_refused(root, root)
    usable, unusable = [], {}
    for path in sorted(root.rglob("*")):
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        if path.name == TRAINING_STATE and path.is_dir() and not path.is_symlink():
            raise run_folder_refused(root, path.parent)
        why = unusable_because(path)
        if why is None:
            usable.append(path)
        elif why:  # "": a folder, whose files are listed on their own
            unusable[path] = why
    return usable, unusable


def run_folder_refused(root: Path, run: Path) -> DatasetError:
    where = "is a training run's folder" if run == root else f"holds a training run's folder, {run.relative_to(root)}"
    return DatasetError(f"{root} {where} (it has {TRAINING_STATE}/): its metrics and checkpoints would be read as "
                        f"text; move the run out of the dataset folder, or give --dataset a folder without it")


def unusable_because(path: Path) -> str | None:
    """Why `path` cannot be read as corpus text, as a phrase ("is ..."); None for a file that can, "" for a
    folder (walked, not read)."""
    try:
        status = path.stat()
    except OSError as e:
        if path.is_symlink():
            what = "loops back on itself" if e.errno == errno.ELOOP else "does not exist"
            return f"is a symbolic link to {os.readlink(path)}, which {what}"
        return f"cannot be read ({e.strerror or e})"
    if stat.S_ISDIR(status.st_mode):
        if path.is_symlink():
            return "is a link to a folder, which is not followed"
        # A folder is walked; one named as a corpus file (an archive unpacked under its own name) is named too.
        return "" if inner_suffix(path) not in FORMATS else "is not a file but a folder (its files are listed)"
    if not stat.S_ISREG(status.st_mode):
        return f"is not a file but {_kind(status.st_mode)}"
    return format_problem(path)


def format_problem(path: Path) -> str | None:
    """Why the file's name says no format that is read (`.csv`, `.tar.gz`, no extension), or None."""
    suffix = inner_suffix(path)
    if suffix in FORMATS:
        return None
    inside = f" inside {path.suffix}" if compression_of(path) else ""
    if not suffix:
        return f"has no extension{inside} to say its format"
    hint = ", but name it .jsonl if it holds one JSON object per line" if suffix == ".json" else ""
    return f"is {suffix}{inside}, not a format read here{hint}"


def unusable_checked(root: Path, unusable: dict[Path, str]) -> None:
    """Refuse the corpus for the files it cannot use, naming each with its reason; or, while skipping them
    (`skipping_unreadable`), name them once in this process and go on."""
    if not unusable:
        return
    named = "; ".join(f"{path.relative_to(root)} {why}" for path, why in list(unusable.items())[:LISTED_UNUSABLE])
    if len(unusable) > LISTED_UNUSABLE:
        named += f"; and {len(unusable) - LISTED_UNUSABLE} more"
    count, them = (f"{len(unusable)} files", "them") if len(unusable) > 1 else ("1 file", "it")
    if not _skip_unreadable.get():
        raise DatasetError(f"{root} holds {count} that cannot be read as text: {named}. Read are {READ_FORMATS}: "
                           f"convert, rename or remove {them}, or pass --skip-unreadable (train.py) to go on "
                           f"without {them}")
    said = (root, tuple(unusable))
    if said not in ANNOUNCED and os.environ.get("RANK", "0") == "0":  # one rank speaks for all
        print(f"data: left out {count} of {root} that cannot be read as text (--skip-unreadable): {named}",
              file=sys.stderr)
    ANNOUNCED.add(said)


def data_file(path: Path) -> DataFile:
    """The corpus file at `path`, refused unless it is (or links to) a regular file."""
    try:
        status = path.stat()
    except OSError as e:
        if path.is_symlink():
            what = "loops back on itself" if e.errno == errno.ELOOP else "does not exist"
            raise DatasetError(f"{path} is a symbolic link to {os.readlink(path)}, which {what}; remove the link or "
                               f"point it at the file") from e
        raise DatasetError(f"{path} cannot be read ({e.strerror or e}); check its permissions") from e
    if not stat.S_ISREG(status.st_mode):
        raise DatasetError(f"{path} is not a file but {_kind(status.st_mode)}; it should hold the split's text, "
                           f"remove it or rename it to another extension")
    return DataFile(path, FORMATS[inner_suffix(path)], status.st_size, compression_of(path))


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    return "a socket" if stat.S_ISSOCK(mode) else "a device"


def refuse_same_bytes(paths: list[Path], root: Path) -> None:
    """One line naming two files of the corpus that hold the same bytes (a copy kept beside its original): read
    twice, its text would train twice, and a passage carved out of one for validation would be training text in
    the other.  (The same text in files that differ as bytes, a file and its .gz, is found as it is read:
    `file_documents`.)  Every file's bytes are hashed for the token cache's key anyway (`content_digest`)."""
    seen: dict[tuple[int, str], Path] = {}
    for path in paths:
        key = (path.stat().st_size, file_hash(path))
        if key[0] == 0:  # empty files are alike without being copies
            continue
        if key in seen:
            raise same_text_refused(seen[key], path, root, "the same bytes")
        seen[key] = path


def same_text_refused(first: Path, second: Path, root: Path, what: str) -> DatasetError:
    def name(path: Path) -> str:
        return str(path.relative_to(root)) if path != root and path.is_relative_to(root) else str(path)
    return DatasetError(f"{name(first)} and {name(second)} in {root} hold {what}: its text would be read twice, "
                        f"and a passage held out of one for validation would be training text in the other; "
                        f"remove one of them (or move it out of the folder)")


def carved_split(index: int) -> str:
    """The split of the `index`-th document of a training text that validation and test are carved from."""
    slot = (index + CARVE_SEED) % CARVE_EVERY
    return "validation" if slot == 0 else "test" if slot == 1 else "train"


def carving_explained(bound: int) -> str:
    """What carving does, for the data line of a carved split."""
    return (f"every {CARVE_EVERY}th passage from a seeded offset ({100 / CARVE_EVERY:.1f}%) is held out, so the model "
            f"is measured on text it does not train on (a passage is a record, i.e. a JSON line or parquet row, or "
            f"an article, and in plain text a stretch ending at a paragraph break, none longer than {bound:,} "
            f"characters; the files are not changed)")


def carving_read(files: list[DataFile], carved: tuple[str, ...], max_chars: int):
    """The pass over the training files that carves `carved` out of them (`carved_split`).  A passage whose text
    came before goes where its first copy went, so no text held out is also trained on (a boilerplate paragraph, a
    repeated article); only the digests of the passages are kept."""
    def read(progress: Progress) -> Iterator[tuple[str, str]]:
        held = None  # the last training document, kept back: a tiny corpus gives it to validation
        held_repeats = False  # whether its text came before
        gave_validation = False
        seen: set[int] = set()  # every passage's digest
        carved_to: dict[int, str] = {}  # a carved passage's digest -> its split
        for index, doc in enumerate(file_documents(files, max_chars, progress)):
            digest = xxhash.xxh3_64_intdigest(doc.encode("utf-8", "surrogatepass"))
            repeats = digest in seen
            if repeats:
                split = carved_to.get(digest, "train")
            else:
                split = carved_split(index)
                split = split if split in carved else "train"
                seen.add(digest)
                if split != "train":
                    carved_to[digest] = split
            if split == "train":
                if held is not None:
                    yield "train", held
                held, held_repeats = doc, repeats
                continue
            gave_validation |= split == "validation"
            yield split, doc
        if held is not None:
            yield ("train" if gave_validation or held_repeats else "validation"), held
    return read


def local_corpus(path: str | Path, name: str | None = None) -> Corpus:
    root = Path(path).expanduser().resolve()
    if not root.exists():
        raise DatasetError(f"dataset {str(path)!r} is neither a known name ({', '.join(DATASET_NAMES)}) nor an "
                           f"existing folder or file")
    if not root.is_dir() and inner_suffix(root) not in FORMATS:
        raise DatasetError(f"{root} is not a corpus file: use .txt or .raw (text), .jsonl (a \"text\" field per "
                           f"line) or .parquet (a \"text\" column), each also compressed ({', '.join(COMPRESSIONS)})")
    paths, unusable = corpus_files(root)
    unusable_checked(root, unusable)
    refuse_same_bytes(paths, root)
    if not paths:
        raise DatasetError(f"{root} holds no corpus files: wiki.*.raw or .txt files, .jsonl files or parquet files "
                           f"(train-*.parquet, validation-*.parquet, test-*.parquet), each also compressed "
                           f"({', '.join(COMPRESSIONS)})")
    # A file whose name says no split is training text, beside named splits too (a books.txt next to train.txt).
    by_split = {s: [p for p in paths if (split_named(p.relative_to(root)) or "train") == s] for s in SPLITS}
    carved = tuple(s for s in ("validation", "test") if not by_split[s]) if not by_split["validation"] else ()
    name = name or f"local:{root}"

    def text_pass(split: str) -> TextPass:
        if carved and by_split["train"] and split in ("train", *carved):
            source = [data_file(p) for p in by_split["train"]]
            total = sum(f.size for f in source)
            bound = document_bound(total)
            key = content_digest(source, CUTTING_VERSION, "carved", carved, CARVE_EVERY, CARVE_SEED, bound)
            listed = files_listed(source, root)
            origins = {"train": f"{listed}, less the passages carved out for {' and '.join(carved)}",
                       **{split: f"{listed}, carved out of the training text: {carving_explained(bound)}"
                          for split in carved}}
            return TextPass(f"local-{key}", ("train", *carved), carving_read(source, carved, bound), total, origins)
        if not by_split[split]:
            raise DatasetError(f"{root} has no {split} split: expected {RAW_FILES[split]}, {split}-*.parquet or "
                               f"another file whose name says {split!r}" +
                               (", or a training split to carve it from" if split != "train" else ""))
        source = [data_file(p) for p in by_split[split]]
        key = content_digest(source, CUTTING_VERSION, split)

        def read(progress: Progress) -> Iterator[tuple[str, str]]:
            return ((split, doc) for doc in file_documents(source, MAX_DOCUMENT_CHARS, progress))
        return TextPass(f"local-{key}", (split,), read, sum(f.size for f in source),
                        {split: files_listed(source, root)})

    return Corpus(name, text_pass)


def whole_file_corpus(path: Path, split: str) -> Corpus:
    """One text file as the given split of a corpus (the leaderboard's --eval-text)."""
    f = DataFile(path, "text", path.stat().st_size, compression_of(path))

    def read(progress: Progress) -> Iterator[tuple[str, str]]:
        return ((split, doc) for doc in file_documents([f], MAX_DOCUMENT_CHARS, progress))

    def text_pass(asked: str) -> TextPass:
        if asked != split:
            raise DatasetError(f"{path} is used as the {split} split alone; it has no {asked} split")
        return TextPass(f"text-{content_digest([f], CUTTING_VERSION, split)}", (split,), read, f.size,
                        {split: files_listed([f], path)})
    return Corpus(f"text:{path.name}", text_pass)
