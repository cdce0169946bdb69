"""Text to documents, in bounded memory: blocks of a text file, lines of a table, cut into documents.

A document ends at a WikiText article heading (a line such as " = Valkyria Chronicles III = "), at the end of
a file, or, in text without headings, at a paragraph boundary once it reaches a bound: so a large heading-less
file becomes many documents instead of one string, and no more than a few blocks of text are ever held.
"""
from __future__ import annotations

import codecs
import contextlib
import io
import re
from pathlib import Path
from typing import Callable, Iterable, Iterator

from data.compressed import READ_ERRORS, open_stream
from runtime.errors import UserError

# An article starts at a top-level heading line such as " = Valkyria Chronicles III = ".  Matched with the
# newline before it, a literal prefix that re finds faster than a line start.
ARTICLE_HEADING = re.compile(r"\n( = [^=\n][^\n]* = )(?=\n)")
NON_BLANK = re.compile(r"\S")
BLOCK_CHARS = 4 << 20  # characters read from a file at a time
MAX_DOCUMENT_CHARS = 1 << 20  # a document without headings is cut at a boundary before this length
MIN_DOCUMENT_CHARS = 4 << 10


class DatasetError(UserError, ValueError):
    pass


def document_bound(total_bytes: int) -> int:
    """The length at which heading-less text is cut: MAX_DOCUMENT_CHARS, less for a corpus too small to make
    some 4,000 documents of that length, so that even a small one yields enough to carve validation and test
    documents from."""
    return max(MIN_DOCUMENT_CHARS, min(MAX_DOCUMENT_CHARS, total_bytes // 4000))


def text_blocks(path: Path, fix: str, progress: Callable[[int], None] = lambda nbytes: None,
                compression: str | None = None) -> Iterator[str]:
    """A UTF-8 file's text (decompressed first when `compression` names how: data/compressed.py), `BLOCK_CHARS`
    at a time, with newlines as text mode reads them (so tokens match a file opened in text mode), calling
    `progress` with the file's bytes each block took.  A byte that is not UTF-8 is one DatasetError naming its
    offset and line, and so is a compressed file that cannot be decompressed."""
    if not path.is_file():
        raise DatasetError(f"{path} is not a file; it should hold the split's text (UTF-8)")
    with contextlib.ExitStack() as opened:
        try:
            stream, raw = opened.enter_context(open_stream(path, compression))
        except OSError as e:
            raise DatasetError(f"{path} cannot be read ({e.strerror or e}); check its permissions") from e
        text = opened.enter_context(io.TextIOWrapper(stream, encoding="utf-8", newline=None))
        reported = 0
        try:
            while block := text.read(BLOCK_CHARS):
                position = raw.tell()
                progress(position - reported)
                reported = position
                yield block
        except UnicodeDecodeError:
            raise _locate_bad_byte(path, fix, compression) from None
        except READ_ERRORS as e:
            raise unreadable_stream(path, compression, e) from e


def unreadable_stream(path: Path, compression: str | None, e: BaseException) -> DatasetError:
    """The error for a file whose bytes stop being readable part-way: a damaged or mislabelled compressed file,
    or a read that fails on the disk."""
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    if compression is None:
        return DatasetError(f"{path} cannot be read ({reason}); check the disk or copy the file again")
    return DatasetError(f"{path} is not a whole {compression} file ({reason}); compress it again or replace it")


def _locate_bad_byte(path: Path, fix: str, compression: str | None = None) -> DatasetError:
    """The error for the first byte of `path`'s text that is not UTF-8 (read again, in blocks, only on failure).
    In a compressed file the offset is in its decompressed text."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    where = " of its decompressed text" if compression else ""
    with open_stream(path, compression) as (f, _):
        while data := f.read(1 << 20):
            held = len(decoder.getstate()[0])  # the start of a character the previous block cut
            try:
                decoder.decode(data)
            except UnicodeDecodeError as e:
                bad = offset - held + e.start  # e.start counts from those held bytes, which come first
                line, byte = _line_and_byte(path, compression, bad)
                return DatasetError(f"{path} is not UTF-8: byte 0x{byte:02x} at offset {bad}{where} (line {line}); "
                                    f"{fix}")
            offset += len(data)
    return DatasetError(f"{path} ends inside a UTF-8 character; {fix}")


def _line_and_byte(path: Path, compression: str | None, offset: int) -> tuple[int, int]:
    """The line number at `offset` of the file's (decompressed) bytes, and the byte there."""
    newlines = 0
    with open_stream(path, compression) as (f, _):
        while offset > 0:
            data = f.read(min(offset, 1 << 20))
            if not data:
                break
            newlines += data.count(b"\n")
            offset -= len(data)
        return newlines + 1, f.read(1)[0]


class DocumentCutter:
    """Text fed in pieces of any size, given back as whole documents (see the module's docstring)."""

    def __init__(self, max_chars: int = MAX_DOCUMENT_CHARS):
        self.max_chars = max_chars
        self.pending = ""  # text not yet given back; it starts a document

    def feed(self, text: str) -> Iterator[str]:
        self.pending += text
        # Only whole lines are cut at headings: the last line may continue in the next piece.
        complete = self.pending.rfind("\n") + 1
        start = 0
        for heading in ARTICLE_HEADING.finditer(self.pending, 0, complete):
            line = heading.start(1)  # a heading on the first line starts the document anyway
            start = yield from self._bounded(start, line)
            if NON_BLANK.search(self.pending, start, line):
                yield self.pending[start:line]
                start = line
        start = yield from self._bounded(start, complete)
        self.pending = self.pending[start:]
        if len(self.pending) > self.max_chars:  # one line longer than the bound
            start = yield from self._bounded(0, len(self.pending))
            self.pending = self.pending[start:]

    def _bounded(self, start: int, end: int):
        """Yield documents cut from pending[start:end] while it is longer than the bound; returns the new start."""
        while end - start > self.max_chars:
            cut = _cut_point(self.pending, start + self.max_chars // 2, start + self.max_chars)
            yield self.pending[start:cut]
            start = cut
        return start

    def finish(self) -> Iterator[str]:
        """The last document, if it holds anything but blanks."""
        if NON_BLANK.search(self.pending):
            yield self.pending
        self.pending = ""


def _cut_point(text: str, lo: int, hi: int) -> int:
    """Where to end a document within text[lo:hi], best first: after the last blank line, after the last line,
    after the last space; else at `hi`.  It depends on the text alone, never on how it was read in pieces."""
    newline = text.rfind("\n", lo, hi)
    line_end = newline
    while line_end != -1:
        previous = text.rfind("\n", lo, line_end)
        if previous != -1 and not text[previous + 1:line_end].strip():
            return line_end + 1
        line_end = previous
    if newline != -1:
        return newline + 1
    space = max(text.rfind(" ", lo, hi), text.rfind("\t", lo, hi))
    return space + 1 if space != -1 else hi


def cut_documents(pieces: Iterable[str], max_chars: int = MAX_DOCUMENT_CHARS) -> Iterator[str]:
    cutter = DocumentCutter(max_chars)
    for piece in pieces:
        yield from cutter.feed(piece)
    yield from cutter.finish()


def split_articles(text: str) -> Iterator[str]:
    """WikiText's text cut into articles at top-level headings (bounded as any heading-less text)."""
    return cut_documents([text])
