"""Corpus files compressed whole: `.gz`, `.bz2`, `.xz` (the standard library) and `.zst` (the zstandard package,
as Python 3.11 has no Zstandard module), around any of the formats data/local_files.py reads
(`notes.txt.gz`, `train.jsonl.zst`, `part-0.parquet.xz`).

`open_stream` gives the decompressed bytes as a stream, and the stream of the file's own bytes beneath it, whose
position says how much of the file a reader has used (progress is counted in the file's bytes, as its size is).
A file that is not what its suffix says, or is cut short, fails while it is read with one of `READ_ERRORS`, which the
readers turn into one error line naming the file.
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
        if compression == "gzip":
            stream = gzip.GzipFile(fileobj=raw, mode="rb")
        elif compression == "bzip2":
            stream = bz2.BZ2File(raw, mode="rb")
        elif compression == "xz":
            stream = lzma.LZMAFile(raw, mode="rb")
        else:
            stream = io.BufferedReader(ZstdFrames(raw))
        with stream:  # a stream over a file it did not open leaves that file open: `raw` is closed above
            yield stream, raw


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a file of Zstandard frames, one after another.  zstandard's own stream reader
    ends quietly where a cut file ends inside a frame; this one raises a ZstdError there, as gzip, bz2 and lzma
    do, so a cut file is never taken for a short one."""

    def __init__(self, raw: BinaryIO):
        self.raw, self.frame = raw, zstandard.ZstdDecompressor().decompressobj()
        self.pending, self.given = b"", 0  # decompressed bytes, and how many of them were read
        self.started = False  # whether the frame being read has had any input

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self.given == len(self.pending):
            data = self.raw.read(1 << 16)
            if not data:
                if self.started and not self.frame.eof:
                    raise zstandard.ZstdError("the file ends inside a frame: it is cut short")
                return 0
            self.pending, self.given = b"", 0
            while data:
                self.started = True
                self.pending += self.frame.decompress(data)
                data = b""
                if self.frame.eof:  # the next frame starts in what this one left
                    data = self.frame.unused_data
                    self.frame, self.started = zstandard.ZstdDecompressor().decompressobj(), False
        n = min(len(buffer), len(self.pending) - self.given)
        buffer[:n] = memoryview(self.pending)[self.given:self.given + n]
        self.given += n
        return n
