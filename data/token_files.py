"""Tokenize a corpus split once into a uint16 file with a small header; memory-map it afterwards.

Layout (after llm.c): a 256-int32 header [magic, version, token count, ...] then the tokens; documents are
joined with end-of-text.  Files live under `$GPT2_DATA_CACHE` (default `.cache/tokens` in the project) in a
folder named by the text pass's content key (data/corpus.py) and the tokenizer.

Tokenizing streams: documents are read a few megabytes at a time, encoded by a pool of threads (tiktoken's
encoder releases the GIL, and `encode_to_numpy` hands back an array without building Python ints), and their
tokens appended to the file in order while later documents are still being encoded.  The header is fixed at the
end and the file renamed into place, so memory does not grow with the corpus and an interrupted run leaves no
file that looks whole.  One process writes a folder at a time (a lock file); another that needs the same tokens
waits for it and then reads them, and a partial file left by a crashed writer is removed by the next.  A cache
folder that cannot be written (read-only, full, a file) is one error naming it and `GPT2_DATA_CACHE`; a token
file that is cut short, foreign, or holds ids beyond GPT-2's vocabulary is refused when it is opened.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from data.corpus import DatasetError, get_corpus
from data.corpus_types import SPLITS, Corpus, TextPass
from data.tokenizer import GPT2_RANKS_SHA256, get_tokenizer
from model.config import EOT_TOKEN, GPT2_VOCAB_SIZE
from runtime.progress import ProgressBar

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
DEFAULT_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "tokens"
TOKENIZER_ID = f"gpt2-{GPT2_RANKS_SHA256[:8]}"
BATCH_CHARS = 1 << 20  # text per encoding task: large enough that a task's overhead is negligible
TASKS_PER_THREAD = 3  # tasks in flight per thread: keeps every thread busy while bounding memory
PARTIAL_SUFFIX = ".partial"
EOT_TEXT = "<|endoftext|>"
CACHE_VARIABLE = "GPT2_DATA_CACHE"
REBUILD = "delete it and it will be rebuilt"
# The token files this process wrote, so its data lines say "tokenized now" rather than "read from the cache".
TOKENIZED_HERE: set[Path] = set()


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_VARIABLE) or DEFAULT_CACHE)


def cache_error(e: OSError, where: Path) -> DatasetError:
    """An OSError writing the cache as the user's fix: the folder (and the variable that chose it) must change."""
    chosen = (f"{CACHE_VARIABLE}={os.environ[CACHE_VARIABLE]}" if os.environ.get(CACHE_VARIABLE)
              else f"the default cache {DEFAULT_CACHE} ({CACHE_VARIABLE} is unset)")
    return DatasetError(f"cannot write the token cache at {where} ({e.strerror or e}): {chosen} must be a folder "
                        f"you can write to, with room for the tokens; point {CACHE_VARIABLE} at one")


def pass_folder(text_pass: TextPass) -> Path:
    return cache_root() / f"{text_pass.key}-{TOKENIZER_ID}"


def encoding_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class TokenFileWriter:
    """A token file written by appending: the header is fixed by `close`, which renames it into place."""

    def __init__(self, path: Path):
        self.path, self.partial = path, path.with_name(path.name + PARTIAL_SUFFIX)
        self.count = 0
        with self.writing():
            self.file: BinaryIO = open(self.partial, "wb")
            self.file.write(bytes(HEADER_BYTES))

    @contextlib.contextmanager
    def writing(self):
        try:
            yield
        except OSError as e:
            raise cache_error(e, self.partial.parent) from e

    def append(self, tokens: np.ndarray) -> None:
        with self.writing():
            self.file.write(tokens.tobytes())
        self.count += len(tokens)

    def close(self) -> None:
        header = np.zeros(HEADER_INTS, dtype=np.int32)
        header[:3] = (MAGIC, VERSION, self.count)
        with self.writing():
            self.file.seek(0)
            self.file.write(header.tobytes())
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            self.partial.replace(self.path)

    def discard(self) -> None:
        with contextlib.suppress(OSError):  # closing flushes, which fails again on a full disk
            self.file.close()
        with contextlib.suppress(OSError):
            self.partial.unlink(missing_ok=True)


def write_tokens(path: Path, tokens: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = TokenFileWriter(path)
    writer.append(tokens.astype(np.uint16))
    writer.close()


def read_tokens(path: Path) -> np.ndarray:
    """The file's tokens, memory-mapped, once its header, length and ids are checked: a damaged file would
    otherwise fail deep inside training."""
    try:
        size = path.stat().st_size
        header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    except OSError as e:
        raise DatasetError(f"{path} cannot be read ({e.strerror or e}); {REBUILD}") from e
    if len(header) < 3 or header[0] != MAGIC:
        raise DatasetError(f"{path} is not a token file (bad magic); {REBUILD}")
    if header[1] != VERSION:
        raise DatasetError(f"{path} has format version {header[1]}, this code reads {VERSION}; delete it")
    if size < HEADER_BYTES:
        raise DatasetError(f"{path} is {size} bytes, cut inside its {HEADER_BYTES}-byte header: truncated; {REBUILD}")
    if (size - HEADER_BYTES) % 2:
        raise DatasetError(f"{path} ends inside a token ({size - HEADER_BYTES} bytes after the header, not whole "
                           f"2-byte tokens): truncated; {REBUILD}")
    count, held = int(header[2]), (size - HEADER_BYTES) // 2
    if held != count:
        raise DatasetError(f"{path} holds {held} tokens but its header says {count}: truncated; {REBUILD}")
    if count == 0:
        return np.zeros(0, dtype=np.uint16)
    tokens = np.memmap(path, dtype=np.uint16, mode="r", offset=HEADER_BYTES)
    if (top := int(tokens.max())) >= GPT2_VOCAB_SIZE:
        raise DatasetError(f"{path} holds token id {top}, beyond GPT-2's vocabulary of {GPT2_VOCAB_SIZE:,}: "
                           f"damaged or written for another tokenizer; {REBUILD}")
    return tokens


def encode_documents(docs: list[str]) -> np.ndarray:
    """The documents' tokens, each followed by end-of-text (run on a pool thread).

    One call encodes them all, joined by the end-of-text marker: tiktoken encodes the text between special
    tokens exactly as it encodes each part alone, and one call hands the GIL back once instead of once per
    document (per-document calls waited on the reading thread and ran slower).  A document that
    holds the marker's text itself is encoded as ordinary text, on its own."""
    encoder = get_tokenizer()
    if any(EOT_TEXT in doc for doc in docs):
        parts = []
        for doc in docs:
            parts.append(encoder.encode_to_numpy(doc, disallowed_special=()))  # = encode_ordinary, as an array
            parts.append(np.array([EOT_TOKEN], dtype=np.uint32))
        return np.concatenate(parts).astype(np.uint16)
    joined = EOT_TEXT.join(docs) + EOT_TEXT
    return encoder.encode_to_numpy(joined, allowed_special={EOT_TEXT}).astype(np.uint16)


def encoding_tasks(documents: Iterator[tuple[str, str]]) -> Iterator[tuple[str, list[str]]]:
    """Consecutive documents of one split grouped into tasks of about BATCH_CHARS characters."""
    split, batch, chars = None, [], 0
    for which, doc in documents:
        if batch and (which != split or chars >= BATCH_CHARS):
            yield split, batch
            batch, chars = [], 0
        split = which
        batch.append(doc)
        chars += len(doc)
    if batch:
        yield split, batch


def tokenize_pass(text_pass: TextPass, folder: Path, label: str) -> None:
    """Write the pass's splits into `folder`, reading its text once (the caller holds the folder's lock)."""
    started, threads = time.perf_counter(), encoding_threads()
    get_tokenizer()  # a missing tokenizer fails here, before any thread starts
    writers = {split: TokenFileWriter(folder / f"{split}.bin") for split in text_pass.splits}
    bar = ProgressBar(total=text_pass.total_bytes, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                      desc=f"tokenizing {label}", mininterval=1.0, dynamic_ncols=True)
    try:
        with ThreadPoolExecutor(threads, thread_name_prefix="tokenize") as pool:
            in_flight: deque[tuple[str, Future]] = deque()
            for split, docs in encoding_tasks(text_pass.read(bar.update)):
                in_flight.append((split, pool.submit(encode_documents, docs)))
                if len(in_flight) >= threads * TASKS_PER_THREAD:
                    done_split, future = in_flight.popleft()
                    writers[done_split].append(future.result())
                    bar.set_postfix_str(f"{sum(w.count for w in writers.values()):,} tokens", refresh=False)
            while in_flight:
                done_split, future = in_flight.popleft()
                writers[done_split].append(future.result())
    except BaseException:
        for writer in writers.values():
            writer.discard()
        bar.close()
        raise
    for writer in writers.values():
        writer.close()
        TOKENIZED_HERE.add(writer.path)
    counts = ", ".join(f"{split} {w.count:,} tokens" for split, w in writers.items())
    bar.set_postfix_str(counts)
    bar.close()  # stays on screen with its rate and totals
    seconds = time.perf_counter() - started
    print(f"data: tokenized {label} in {seconds:.1f} s ({bar.n / seconds / 1e6:.1f} MB/s of text, {threads} threads): "
          f"{counts}", file=sys.stderr)


@contextlib.contextmanager
def folder_lock(folder: Path, label: str):
    """The folder's writer lock, waited for (with a message saying whom for) while another process holds it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / ".lock", "a+")
    except OSError as e:
        raise cache_error(e, folder) from e
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            print(f"data: waiting for {holder}, which is tokenizing {label} into {folder}", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError as e:  # a file system without locks
            raise cache_error(e, folder) from e
        try:
            lock.seek(0)
            lock.truncate()
            lock.write(f"process {os.getpid()} on {os.uname().nodename}")
            lock.flush()
        except OSError as e:
            raise cache_error(e, folder) from e
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def corpus_of(dataset: str | Corpus) -> Corpus:
    return get_corpus(dataset) if isinstance(dataset, str) else dataset


def short_name(corpus: Corpus) -> str:
    return corpus.name if len(corpus.name) <= 40 else f"...{corpus.name[-37:]}"


def prepare_split(dataset: str | Corpus, split: str) -> Path:
    """The split's token file, tokenizing its pass first if no process has (waiting for one that is).  A cache
    that cannot be written still serves the tokens it holds."""
    return _prepare(corpus_of(dataset), split)[1]


def _prepare(corpus: Corpus, split: str) -> tuple[TextPass, Path]:
    if split not in SPLITS:
        raise DatasetError(f"unknown split {split!r}; choose one of {SPLITS}")
    text_pass = corpus.text_pass(split)
    folder = pass_folder(text_pass)
    path = folder / f"{split}.bin"
    if path.exists():
        return text_pass, path
    label = f"{short_name(corpus)} {'+'.join(text_pass.splits)}"
    with folder_lock(folder, label):
        if not path.exists():  # another process may have written it while this one waited
            # Left by a writer that crashed (".tmp<pid>": by this code's earlier versions); none is writing now.
            try:
                for stale in [*folder.glob(f"*{PARTIAL_SUFFIX}"), *folder.glob("*.tmp[0-9]*")]:
                    stale.unlink(missing_ok=True)
            except OSError as e:
                raise cache_error(e, folder) from e
            tokenize_pass(text_pass, folder, label)
    return text_pass, path


def load_split(dataset: str | Corpus, split: str) -> np.ndarray:
    """The split's tokens as a read-only memmap, tokenizing on first use; says what they are (`data_line`)."""
    corpus = corpus_of(dataset)
    text_pass, path = _prepare(corpus, split)
    tokens = read_tokens(path)
    if len(tokens) == 0:
        raise DatasetError(f"{corpus.name} split {split} has no text")
    if os.environ.get("RANK", "0") == "0":  # one rank of a distributed run speaks for all: they load the same
        print(data_line(corpus, text_pass, split, len(tokens), path), file=sys.stderr)
    return tokens


def data_line(corpus: Corpus, text_pass: TextPass, split: str, tokens: int, path: Path) -> str:
    """A split's one line, every run: its tokens, whether this process tokenized them, and where their text comes
    from (its files and sizes, or how it was carved), e.g. `data: local:/corpus train: 43,953 tokens (read from the
    cache) from notes.txt (152 KB)`."""
    how = "tokenized now" if path in TOKENIZED_HERE else "read from the cache"
    origin = text_pass.origins.get(split)
    return f"data: {corpus.name} {split}: {tokens:,} tokens ({how}){f' from {origin}' if origin else ''}"
