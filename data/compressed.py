"""Corpus files compressed whole: `.gz`, `.bz2`, `.xz` (the standard library) and `.zst` (the zstandard package,
as Python 3.11 has no Zstandard module), around any of the formats data/local_files.py reads
(`notes.txt.gz`, `train.jsonl.zst`, `part-0.parquet.xz`).

`open_stream` gives the decompressed bytes as a stream, and the stream of the file's own bytes beneath it, whose
position says how much of the file a reader has used (progress is counted in the file's bytes, as its size is).
A file that is not what its suffix says, is cut short, holds a damaged stream among several, or has bytes after its
last stream, fails while it is read with one of `READ_ERRORS`, which the readers turn into one error line naming
the file.
"""
from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator

import zstandard

# The suffix of each compression, and its name in messages and in the token cache's key.
COMPRESSIONS = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd"}
# What a damaged or mislabelled compressed file raises while it is read: gzip's BadGzipFile and bz2's "Invalid data
# stream" are OSErrors, a cut stream is an EOFError, and lzma, zlib and zstandard have their own.
READ_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error, zstandard.ZstdError)


def compression_of(path: Path) -> str | None:
    """The compression the file's last suffix names (in any case), or None."""
    return COMPRESSIONS.get(path.suffix.lower())


def inner_suffix(path: Path) -> str:
    """The suffix that says the format: the one before a compression's, else the last (`a.TXT.gz` -> `.txt`)."""
    name = Path(path.stem) if compression_of(path) else path
    return name.suffix.lower()


@contextlib.contextmanager
def open_stream(path: Path, compression: str | None) -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """(decompressed stream, the file's own stream) of `path`, both closed on leaving."""
    with open(path, "rb") as raw:
        if compression is None:
            yield raw, raw
            return
        if compression == "gzip":  # GzipFile reads member after member and refuses trailing bytes itself
            stream = gzip.GzipFile(fileobj=raw, mode="rb")
        else:
            stream = io.BufferedReader(Streams(raw, STREAM_DECOMPRESSORS[compression]))
        with stream:  # a stream over a file it did not open leaves that file open: `raw` is closed above
            yield stream, raw


# A fresh decompressor for one stream (a Zstandard frame) of each compression Streams reads.
STREAM_DECOMPRESSORS = {"bzip2": bz2.BZ2Decompressor, "xz": lzma.LZMADecompressor,
                        "zstd": lambda: zstandard.ZstdDecompressor().decompressobj()}
READ_BYTES = 1 << 16  # of the file at a time
# The most decompressed bytes one call gives, where the decompressor can stop there (bzip2 and xz; zstandard's
# gives what its READ_BYTES of input hold): a stream that expands a thousandfold is read in pieces.
PIECE_BYTES = 1 << 20


class Streams(io.RawIOBase):
    """The decompressed bytes of a file of compressed streams one after another: pbzip2's output, `cat a.bz2 b.bz2`,
    `xz` of several streams, Zstandard frames.  Each stream is read by a decompressor of its own, and every byte of
    the file belongs to a whole stream: a damaged stream, a file that ends inside one, or bytes after the last that
    are not a stream raise one of READ_ERRORS.  (The standard library's readers take an error at the start of any
    stream after the first for trailing garbage and end there quietly, dropping it and every stream after it, and
    zstandard's own reader ends quietly where a cut file ends.)"""

    def __init__(self, raw: BinaryIO, new_decompressor):
        self.raw, self.new = raw, new_decompressor
        self.stream, self.started = new_decompressor(), False  # started: the stream being read has had input
        self.leftover = b""  # bytes after a finished stream, read from the file already: the next one's start
        self.pending, self.given = b"", 0  # decompressed bytes, and how many of them were read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self.given == len(self.pending):
            piece = self._next_piece()
            if piece is None:
                return 0
            self.pending, self.given = piece, 0
        n = min(len(buffer), len(self.pending) - self.given)
        buffer[:n] = memoryview(self.pending)[self.given:self.given + n]
        self.given += n
        return n

    def _next_piece(self) -> bytes | None:
        """The next decompressed bytes (perhaps none yet), or None where the file ends after a whole stream."""
        if self.stream.eof:  # the next stream starts in what this one left
            self.leftover, self.stream, self.started = self.stream.unused_data, self.new(), False
        bounded = hasattr(self.stream, "needs_input")
        data = b""
        if not bounded or self.stream.needs_input:
            data, self.leftover = self.leftover or self.raw.read(READ_BYTES), b""
            if not data:
                if self.started:
                    raise EOFError("the file ends inside a compressed stream: it is cut short")
                return None
        self.started = True
        return self.stream.decompress(data, PIECE_BYTES) if bounded else self.stream.decompress(data)
