"""data/compressed.py on its own: which compression a name says, and the stream of every stream's bytes read back
exactly, whatever the sizes it is read in (the readers' tests, test_data_documents and test_hostile_data, hold the
damaged and mislabelled files)."""
from __future__ import annotations

import bz2
import gzip
import lzma
import random
from pathlib import Path

import pytest
import zstandard

from data.compressed import PIECE_BYTES, READ_BYTES, READ_ERRORS, compression_of, inner_suffix, open_stream

COMPRESS = {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress,
            "zstd": lambda data: zstandard.ZstdCompressor().compress(data)}
SUFFIX = {"gzip": ".gz", "bzip2": ".bz2", "xz": ".xz", "zstd": ".zst"}


@pytest.mark.parametrize("name, compression, inner", [
    ("a.txt", None, ".txt"), ("a.TXT.GZ", "gzip", ".txt"), ("b.jsonl.Bz2", "bzip2", ".jsonl"),
    ("c.parquet.xz", "xz", ".parquet"), ("d.txt.zst", "zstd", ".txt"), ("e.zip", None, ".zip"),
    ("f.gz", "gzip", ""), ("g.tar.gz", "gzip", ".tar")])
def test_a_name_says_its_compression_and_the_format_inside(name, compression, inner):
    assert compression_of(Path(name)) == compression and inner_suffix(Path(name)) == inner


def read_all(path: Path, compression: str | None, size: int) -> bytes:
    """Every decompressed byte, read `size` at a time (-1: at once)."""
    with open_stream(path, compression) as (stream, raw):
        if size < 0:
            data = stream.read()
        else:
            pieces = []
            while piece := stream.read(size):
                pieces.append(piece)
            data = b"".join(pieces)
        assert raw.tell() == path.stat().st_size  # the file's own bytes, every one used
    return data


@pytest.mark.parametrize("compression", [*COMPRESS, None])
def test_an_empty_file_is_no_text(tmp_path, compression):
    path = tmp_path / f"empty.txt{SUFFIX.get(compression, '')}"
    path.write_bytes(b"")
    assert read_all(path, compression, -1) == b""


@pytest.mark.parametrize("compression", COMPRESS)
@pytest.mark.parametrize("size", [1, 7, 4096, -1])
def test_every_stream_is_read_back_exactly_in_reads_of_any_size(tmp_path, compression, size):
    """Streams of different sizes, one past READ_BYTES of input, one expanding past PIECE_BYTES, one empty."""
    rng = random.Random(0)
    texts = [bytes(rng.getrandbits(8) for _ in range(READ_BYTES + 5000)),  # incompressible: past one file read
             b"a" * (PIECE_BYTES * 3 + 11),  # a thousandfold: decompressed in pieces
             b"", b"the last stream\n"]
    if size == 1:  # a byte at a time through a few megabytes takes a while: the small streams only
        texts = [texts[0][:3000], b"", b"the last stream\n"]
    path = tmp_path / f"t.txt{SUFFIX[compression]}"
    path.write_bytes(b"".join(COMPRESS[compression](t) for t in texts))
    assert read_all(path, compression, size) == b"".join(texts)


@pytest.mark.parametrize("compression", ["bzip2", "xz", "zstd"])
def test_a_file_cut_anywhere_inside_a_stream_is_an_error_never_less_text(tmp_path, compression):
    data = COMPRESS[compression](b"a sentence of the corpus\n" * 200) * 2
    for cut in (1, len(data) // 4, len(data) // 2 + 3, len(data) - 1):
        path = tmp_path / f"cut{cut}.txt{SUFFIX[compression]}"
        path.write_bytes(data[:cut])
        with pytest.raises(READ_ERRORS):
            read_all(path, compression, -1)
