"""Hostile inputs to the corpus and token-cache surfaces (tests/hostile.py's property): a corpus folder of any
files, a token file damaged any way, a cache that cannot be written.  Preparing data (data/token_files.py, in-process,
as the trainer does) either works or stops with one error line naming the problem, and the corpus is untouched.
"""
from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import re
import shutil
import tempfile
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from data import token_files
from data.corpus import DatasetError
from data.compressed import compression_of, inner_suffix
from data.local_files import CUTTING_VERSION, FORMATS, DataFile, content_digest, local_corpus, skipping_unreadable
from data.token_files import HEADER_BYTES, MAGIC, VERSION, load_split, read_tokens, write_tokens
from model.config import GPT2_VOCAB_SIZE
from tests.hostile import attempt, check_error_line, examples, record, run_command, unchanged

CORPUS, TOKEN_CACHE = "corpus", "token cache"
STEMS = ("train", "wiki.train", "valid", "dev", "test", "books", "part-00000", "notes")
# Formats read, compressed ones, and names that say no format read (.md, .csv, .json, a bare name, .tar.gz).
EXTENSIONS = (".txt", ".raw", ".text", ".jsonl", ".parquet", ".md", ".txt.gz", ".jsonl.zst", ".parquet.bz2",
              ".raw.xz", ".text.zst", ".csv", ".json.gz", "", ".tar.gz")
# What a file of each extension holds when it is what it says (compressed as its name says): text for the others.
FITTING = {".jsonl": ("jsonl",), ".parquet": ("parquet", "parquet dictionary", "parquet string_view")}
FITTING_TEXT = ("utf-8", "utf-8, no final newline", "one line", "empty")
HOSTILE = ("latin-1", "utf-16 with BOM", "random bytes", "jsonl with a lone surrogate", "jsonl nested deeply",
           "parquet damaged",
           "dangling link", "looping link", "link out of the folder", "fifo", "folder", "compressed, cut short",
           "not compressed", "link to a folder", "hidden")
COMPRESS = {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress,
            "zstd": lambda data: zstandard.ZstdCompressor().compress(data)}
SENTENCE = "The corpus says something of its own , line {i} .\n"


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2_DATA_CACHE", str(tmp_path / "cache"))


def prepare(dataset: str | Path) -> None:
    """What the trainer does before its first step: both splits tokenized and opened."""
    for split in ("train", "validation"):
        load_split(str(dataset), split)


def gpt2_tokens(documents) -> np.ndarray:
    encoder = token_files.get_tokenizer()
    return np.array([t for doc in documents for t in encoder.encode_ordinary(doc) + [50256]], dtype=np.uint16)


# --- drawing corpus folders -----------------------------------------------------------------------------

@st.composite
def file_names(draw) -> str:
    """A corpus-like file name whose extension is in any case (".txt", ".RAW", ".PaRqUeT")."""
    extension = draw(st.sampled_from(EXTENSIONS))
    case = draw(st.sampled_from(("lower", "lower", "upper", "mixed")))
    if case == "mixed":
        upper = draw(st.lists(st.booleans(), min_size=len(extension), max_size=len(extension)))
        extension = "".join(c.upper() if u else c for c, u in zip(extension, upper))
    return draw(st.sampled_from(STEMS)) + (extension.upper() if case == "upper" else extension)


def parquet_bytes(texts: list[str], layout: str) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    column = pa.array(texts)
    if layout == "parquet dictionary":
        column = column.dictionary_encode()
    elif layout == "parquet string_view":
        column = column.cast(pa.string_view())
    sink = io.BytesIO()
    pq.write_table(pa.table({"text": column}), sink, compression="none")
    return sink.getvalue()


def content_bytes(kind: str, text: str, noise: bytes) -> bytes:
    """The bytes of a regular corpus file of the given kind; `noise` damages or replaces them."""
    if kind == "utf-8":
        return text.encode()
    if kind == "utf-8, no final newline":
        return text.rstrip("\n").encode()
    if kind == "one line":
        return text.replace("\n", " ").encode()
    if kind == "latin-1":
        return text.encode("latin-1", "replace")
    if kind == "utf-16 with BOM":
        return text.encode("utf-16")
    if kind == "random bytes":
        return noise
    if kind == "empty":
        return b""
    if kind.startswith("jsonl"):
        lines = [json.dumps({"text": line}) for line in text.splitlines(keepends=True)]
        if kind.endswith("surrogate"):
            lines.insert(len(lines) // 2, '{"text": "bad \\ud800 x"}')
        elif kind.endswith("deeply"):  # deeper than the JSON parser's recursion allows: a RecursionError
            lines.insert(len(lines) // 2, '{"text": ' + "[" * 100_000 + "]" * 100_000 + "}")
        return "\n".join(lines).encode()
    if kind in ("compressed, cut short", "not compressed"):  # a compressed name is compressed in `write_entry`
        return text.encode()
    data = bytearray(parquet_bytes(text.splitlines(keepends=True) or [text], kind))
    if kind == "parquet damaged":  # bytes overwritten past the magic, in pages or footer
        for i, b in enumerate(noise[:8]):
            data[4 + (b * 7919 + i * 104729) % (len(data) - 8)] = noise[-1 - i]
    return bytes(data)


def write_entry(folder: Path, outside: Path, name: str, kind: str, text: str, noise: bytes) -> None:
    path = folder / name
    if kind == "dangling link":
        path.symlink_to(folder / "no-such-file.txt")
    elif kind == "looping link":
        path.symlink_to(path.name)
    elif kind == "link out of the folder":
        target = outside / f"target-{name}"
        target.write_bytes(content_bytes("utf-8", text, noise))
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
        (path / "inside.txt").write_text(text)
    elif kind == "link to a folder":
        (outside / f"folder-{name}").mkdir()
        (outside / f"folder-{name}" / "inside.txt").write_text(text)
        path.symlink_to(outside / f"folder-{name}")
    elif kind == "hidden":  # passed over without a word: a name starting with "."
        (folder / f".{name}").write_bytes(noise)
    else:
        data = content_bytes(kind, text, noise)
        compression = compression_of(path)
        if compression and kind != "not compressed":
            data = COMPRESS[compression](data)
            data = data[:len(data) // 2] if kind == "compressed, cut short" else data
        path.write_bytes(data)


texts = st.text(max_size=120).map(lambda t: t + SENTENCE.format(i=len(t)) * 3)


@st.composite
def corpus_entries(draw) -> list[tuple[str, str, str, bytes]]:
    """(name, kind, text, noise) for a few files that are what their names say, and at most one hostile entry, so
    that entry, not an earlier refusal, decides what happens."""
    names = draw(st.lists(file_names(), min_size=1, max_size=4, unique=True))
    hostile = draw(st.sampled_from((True, True, False)))
    entries = []
    for i, name in enumerate(names):
        fitting = FITTING.get(inner_suffix(Path(name)), FITTING_TEXT)
        kind = draw(st.sampled_from(HOSTILE if hostile and i == 0 else fitting))
        entries.append((name, kind, draw(texts), draw(st.binary(min_size=9, max_size=64))))
    return entries


@contextmanager
def corpus_folder(entries):
    """A fresh folder holding the entries, and beside it the folder the escaping links point into."""
    with tempfile.TemporaryDirectory() as tmp:
        folder, outside = Path(tmp) / "corpus", Path(tmp) / "outside"
        folder.mkdir()
        outside.mkdir()
        for entry in entries:
            write_entry(folder, outside, *entry)
        yield folder, outside


@examples(60)
@given(entries=corpus_entries(), skip=st.booleans())
def test_any_corpus_folder_prepares_or_is_one_error_line(entries, skip):
    """...and whatever was not read was named: a folder prepares without --skip-unreadable only when every file
    in it (hidden ones aside) is one that is read."""
    with corpus_folder(entries) as (folder, outside), unchanged(CORPUS, folder, outside), skipping_unreadable(skip):
        outcome = attempt(CORPUS, lambda: prepare(folder))
        if outcome == "worked" and not skip:
            assert all(kind in ("hidden", "folder") or inner_suffix(Path(name)) in FORMATS
                       for name, kind, _, _ in entries), entries


# --- drawing damaged token files and unwritable caches ---------------------------------------------------

DAMAGES = ("none", "cut", "odd tail", "foreign header", "id beyond the vocabulary")


@examples(30)
@given(ids=st.lists(st.integers(0, GPT2_VOCAB_SIZE - 1), min_size=1, max_size=200), damage=st.sampled_from(DAMAGES),
       data=st.data())
def test_any_damaged_token_file_is_one_error_line(ids, damage, data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.bin"
        write_tokens(path, np.array(ids))
        whole = path.read_bytes()
        if damage == "cut":
            path.write_bytes(whole[:data.draw(st.integers(0, len(whole) - 1), label="cut at")])
        elif damage == "odd tail":
            path.write_bytes(whole + b"\0")
        elif damage == "foreign header":
            header = data.draw(st.binary(min_size=HEADER_BYTES, max_size=HEADER_BYTES), label="header")
            path.write_bytes(header + whole[HEADER_BYTES:])
        elif damage == "id beyond the vocabulary":
            tokens = np.array(ids, dtype=np.uint16)
            tokens[data.draw(st.integers(0, len(ids) - 1), label="at")] = data.draw(
                st.integers(GPT2_VOCAB_SIZE, 2**16 - 1), label="id")
            path.write_bytes(whole[:HEADER_BYTES] + tokens.tobytes())
        head = path.read_bytes()[:12]  # a cut file may hold less than three whole numbers
        header_is_ours = len(head) == 12 and np.frombuffer(head, np.int32).tolist() == [MAGIC, VERSION, len(ids)]
        with unchanged(TOKEN_CACHE, path):
            outcome = attempt(TOKEN_CACHE, lambda: read_tokens(path))
        harmless = damage == "none" or (damage == "foreign header" and header_is_ours)
        assert outcome == ("worked" if harmless else "refused"), damage


CACHE_PLACES = ("a file", "a device", "under a file", "a system folder", "a full disk")


@contextmanager
def cache_at(place: str, tmp: Path, monkeypatch):
    """GPT2_DATA_CACHE at a place no token file can be written to."""
    (tmp / "file").write_text("not a folder")
    where = {"a file": tmp / "file", "a device": Path("/dev/null"), "under a file": tmp / "file" / "cache",
             "a system folder": Path("/sys/gpt2-token-cache"), "a full disk": tmp / "cache"}[place]
    with monkeypatch.context() as m:
        m.setenv("GPT2_DATA_CACHE", str(where))
        if place == "a full disk":  # every token file written goes to /dev/full, whose writes fail with ENOSPC
            m.setattr(token_files, "open", lambda path, mode="r", *a, **k: open(
                "/dev/full" if str(path).endswith(token_files.PARTIAL_SUFFIX) else path, mode, *a, **k), raising=False)
        yield


@pytest.mark.skipif(not Path("/dev/full").exists() or not Path("/sys").is_dir(), reason="needs Linux's /dev and /sys")
@examples(10)
@given(place=st.sampled_from(CACHE_PLACES), lines=st.integers(1, 400))
def test_an_unwritable_cache_is_one_error_line(place, lines, monkeypatch):
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "train.txt"
        corpus.write_text("".join(SENTENCE.format(i=i) for i in range(lines)))  # up to twice the write buffer
        with cache_at(place, Path(tmp), monkeypatch), unchanged(CORPUS, corpus):
            assert attempt(TOKEN_CACHE, lambda: prepare(corpus)) == "refused"


# --- regressions, exactly --------------------------------------------------------------------------------

def test_files_naming_no_split_join_the_training_text(tmp_path, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    train, books, held_out = (SENTENCE.format(i=i) * 5 for i in range(3))
    (folder / "train.txt").write_text(train)
    (folder / "books.TXT").write_text(books)  # names no split, extension in capitals
    (folder / "wiki.valid.RAW").write_text(held_out)
    assert np.array_equal(load_split(str(folder), "train"), gpt2_tokens([books, train]))  # in name order
    assert f"(tokenized now) from books.TXT ({len(books)} bytes), train.txt ({len(train)} bytes)\n" in \
        capsys.readouterr().err
    assert np.array_equal(load_split(str(folder), "validation"), gpt2_tokens([held_out]))
    assert f"(tokenized now) from wiki.valid.RAW ({len(held_out)} bytes)\n" in capsys.readouterr().err


def test_the_data_line_counts_the_files_past_the_first_few(tmp_path):
    for i in range(5):
        (tmp_path / f"part-{i}.txt").write_text(f"{i}" + "x" * 1499)  # not copies of one another, which are refused
    assert local_corpus(tmp_path).text_pass("train").origins["train"] == \
        "part-0.txt (2 KB), part-1.txt (2 KB), part-2.txt (2 KB) and 2 more (3 KB), less the passages carved out " \
        "for validation and test"


def test_a_same_length_edit_anywhere_gives_a_new_key(tmp_path):
    path = tmp_path / "train.txt"
    text = bytearray(b"".join(SENTENCE.format(i=i).encode() for i in range(40_000)))  # ~2 MB
    path.write_bytes(text)
    before = content_digest([DataFile(path, "text", len(text))], CUTTING_VERSION)
    text[40_000] ^= 1  # between the first two of the 32 blocks of 16 KiB the key used to sample
    path.write_bytes(text)
    assert content_digest([DataFile(path, "text", len(text))], CUTTING_VERSION) != before


def test_a_lone_surrogate_is_one_error_naming_file_and_line(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"text": "fine"}\n{"text": "bad \\ud800 x"}\n')
    with pytest.raises(DatasetError, match=r"train.jsonl line 2: its \"text\" holds a lone surrogate \(\\ud800\)"):
        prepare(tmp_path / "train.jsonl")


def test_a_json_line_nested_past_the_parser_s_depth_is_one_error_naming_file_and_line(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"text": "fine"}\n{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(DatasetError, match=r"train.jsonl line 2 is not a JSON object \(nested deeper than the parser"):
        prepare(tmp_path / "train.jsonl")


def test_damaged_token_files_name_the_damage(tmp_path):
    path = tmp_path / "t.bin"
    write_tokens(path, np.arange(100))
    whole = path.read_bytes()
    path.write_bytes(whole[:-1])
    with pytest.raises(DatasetError, match="ends inside a token .199 bytes after the header"):
        read_tokens(path)
    path.write_bytes(whole[:500])
    with pytest.raises(DatasetError, match="is 500 bytes, cut inside its 1024-byte header: truncated"):
        read_tokens(path)
    path.write_bytes(whole[:-2] + np.uint16(60_000).tobytes())
    with pytest.raises(DatasetError, match="holds token id 60000, beyond GPT-2's vocabulary of 50,257"):
        read_tokens(path)


def test_an_unwritable_cache_names_the_variable_and_the_fix(tmp_path, monkeypatch):
    (tmp_path / "train.txt").write_text(SENTENCE.format(i=0))
    monkeypatch.setenv("GPT2_DATA_CACHE", str(tmp_path / "train.txt"))
    with pytest.raises(DatasetError, match=r"cannot write the token cache at .*: GPT2_DATA_CACHE=.*train.txt must be "
                                           r"a folder you can write to, with room for the tokens"):
        prepare(tmp_path / "train.txt")


def test_parquet_text_in_other_layouts_is_text_and_damaged_pages_are_named(tmp_path):
    texts = [SENTENCE.format(i=i) * 3 for i in range(20)]
    expected = gpt2_tokens(texts)
    for layout in ("parquet", "parquet dictionary", "parquet string_view"):
        folder = tmp_path / layout.replace(" ", "-")
        folder.mkdir()
        (folder / "train-00000-of-00001.parquet").write_bytes(parquet_bytes(texts, layout))
        (folder / "validation-00000-of-00001.parquet").write_bytes(parquet_bytes(["Held out ."], layout))
        assert np.array_equal(load_split(str(folder), "train"), expected), layout
    data = parquet_bytes(texts, "parquet")
    at = data.index(b"line 7")
    (tmp_path / "damaged.parquet").write_bytes(data[:at] + b"\xff\xfe" + data[at + 2:])  # a page's text not UTF-8
    with pytest.raises(DatasetError, match=r"damaged.parquet is damaged after row 0 \("):
        load_split(str(tmp_path / "damaged.parquet"), "train")


def test_links_and_pipes_in_a_corpus(tmp_path):
    folder, outside = tmp_path / "corpus", tmp_path / "blobs"
    folder.mkdir()
    outside.mkdir()
    (outside / "blob").write_text(SENTENCE.format(i=1) * 3)
    (folder / "train.txt").symlink_to(outside / "blob")  # as the hub's cache lays files out: followed
    (folder / "valid.txt").write_text("Held out .")
    assert np.array_equal(load_split(str(folder), "train"), gpt2_tokens([SENTENCE.format(i=1) * 3]))
    test = folder / "test.txt"
    test.symlink_to(folder / "gone.txt")
    with pytest.raises(DatasetError, match=r"test.txt is a symbolic link to .*gone.txt, which does not exist"):
        load_split(str(folder), "test")
    test.unlink()
    test.symlink_to("test.txt")
    with pytest.raises(DatasetError, match=r"test.txt is a symbolic link to test.txt, which loops back on itself"):
        load_split(str(folder), "test")
    test.unlink()
    os.mkfifo(test)
    with pytest.raises(DatasetError, match=r"test.txt is not a file but a named pipe \(FIFO\)"):
        load_split(str(folder), "test")


# --- compressed files, files that cannot be used, run folders (issue 54) --------------------------------------

@pytest.mark.parametrize("compression, suffix", [(c, s) for c, s in (("gzip", ".gz"), ("bzip2", ".bz2"), ("xz", ".xz"),
                                                                     ("zstd", ".zst"))])
def test_compressed_files_of_each_format_read_as_the_plain_ones(tmp_path, compression, suffix, capsys):
    texts = [SENTENCE.format(i=i) * 3 for i in range(30)]
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    files = {"notes.txt": "".join(texts).encode(), "records.jsonl": "\n".join(json.dumps({"text": t})
                                                                              for t in texts).encode(),
             "table.parquet": parquet_bytes(texts, "parquet"), "wiki.valid.raw": b"Held out .\n"}
    for name, data in files.items():
        (plain / name).write_bytes(data)
        (packed / f"{name}{suffix}").write_bytes(COMPRESS[compression](data))
    assert np.array_equal(load_split(str(packed), "train"), load_split(str(plain), "train"))
    assert np.array_equal(load_split(str(packed), "validation"), gpt2_tokens(["Held out .\n"]))
    assert f"notes.txt{suffix} (" in capsys.readouterr().err  # named in the data line like any other file


def test_a_compressed_file_named_alone_is_read(tmp_path):
    (tmp_path / "corpus.txt.gz").write_bytes(gzip.compress(b"".join(SENTENCE.format(i=i).encode()
                                                                    for i in range(400))))
    assert len(load_split(str(tmp_path / "corpus.txt.gz"), "train")) > 0


def test_a_damaged_compressed_file_is_one_error_naming_it(tmp_path):
    whole = gzip.compress(SENTENCE.format(i=0).encode() * 200)
    (tmp_path / "train.txt.gz").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(DatasetError, match=r"train.txt.gz is not a whole gzip file \(.*\); compress it again or "
                                           r"replace it"):
        load_split(str(tmp_path), "train")
    (tmp_path / "train.txt.gz").write_bytes(b"plain text, not gzip\n")
    with pytest.raises(DatasetError, match=r"train.txt.gz is not a whole gzip file"):
        load_split(str(tmp_path), "train")
    (tmp_path / "train.txt.gz").unlink()
    (tmp_path / "train.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "a"}\n' * 50)[:-6])
    with pytest.raises(DatasetError, match=r"train.jsonl.zst is not a whole zstd file"):
        load_split(str(tmp_path), "train")


MULTI_STREAM = [(c, s) for c, s in (("gzip", ".gz"), ("bzip2", ".bz2"), ("xz", ".xz"), ("zstd", ".zst"))]


@pytest.mark.parametrize("compression, suffix", MULTI_STREAM)
def test_every_stream_of_a_multi_stream_file_is_read(tmp_path, compression, suffix):
    """`cat a.zst b.zst` and pbzip2's output: the streams after the first are text too (a reader that stopped
    after the first frame of a .zst dropped the rest without a word)."""
    texts = [SENTENCE.format(i=i) * 40 for i in range(3)]
    (tmp_path / f"train.txt{suffix}").write_bytes(b"".join(COMPRESS[compression](t.encode()) for t in texts))
    (tmp_path / "whole").mkdir()
    (tmp_path / "whole" / "train.txt").write_text("".join(texts))
    assert np.array_equal(load_split(str(tmp_path / f"train.txt{suffix}"), "train"),
                          load_split(str(tmp_path / "whole" / "train.txt"), "train"))


@pytest.mark.parametrize("compression, suffix", MULTI_STREAM)
@pytest.mark.parametrize("damage", ["a byte flipped in the second stream", "the second stream's first bytes",
                                    "bytes after the last stream", "cut inside the last stream"])
def test_a_damaged_or_trailing_stream_among_several_is_one_error_naming_the_file(tmp_path, compression, suffix,
                                                                                  damage):
    # zstd frames with their checksum, as the zstd tool writes them: a flipped byte is found, not decoded as other text
    compress = (lambda data: zstandard.ZstdCompressor(write_checksum=True).compress(data)) if compression == "zstd" \
        else COMPRESS[compression]
    streams = [compress((SENTENCE.format(i=i) * 400).encode()) for i in range(3)]
    data = bytearray(b"".join(streams))
    if damage == "a byte flipped in the second stream":
        data[len(streams[0]) + len(streams[1]) // 2] ^= 0xFF
    elif damage == "the second stream's first bytes":
        data[len(streams[0]):len(streams[0]) + 4] = b"junk"
    elif damage == "bytes after the last stream":
        data += b"trailing garbage\n"
    else:
        data = data[:-7]
    (tmp_path / f"train.txt{suffix}").write_bytes(bytes(data))
    with unchanged(CORPUS, tmp_path / f"train.txt{suffix}"), \
            pytest.raises(DatasetError, match=rf"train.txt{re.escape(suffix)} is not a whole {compression} file "
                                              rf"\(.+\); compress it again or replace it$"):
        load_split(str(tmp_path / f"train.txt{suffix}"), "train")
    record(CORPUS, "refused", f"{compression}: {damage}")


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.bz2"])
def test_a_line_past_the_bound_is_one_error_naming_the_file_and_line_read_in_bounded_memory(tmp_path, suffix,
                                                                                         monkeypatch):
    monkeypatch.setattr("data.local_files.MAX_LINE_BYTES", 1 << 20)
    long_line = json.dumps({"text": "x" * (8 << 20)})  # 8 MB in a .gz of some 8 KB
    data = (json.dumps({"text": "fine"}) + "\n" + long_line + "\n").encode()
    compress = {".jsonl": bytes, ".jsonl.gz": gzip.compress, ".jsonl.bz2": bz2.compress}[suffix]
    (tmp_path / f"train{suffix}").write_bytes(compress(data))
    tracemalloc.start()
    try:
        with pytest.raises(DatasetError, match=rf"train{re.escape(suffix)} line 2 is longer than 1.0 MB, the most a "
                                               rf"line \(one record\) may hold; split its text into several records"):
            load_split(str(tmp_path / f"train{suffix}"), "train")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 << 20, f"a refused line is not held whole: {peak:,} bytes at the peak"


def test_a_compressed_parquet_file_that_is_not_parquet_is_refused_from_its_first_bytes(tmp_path):
    (tmp_path / "train.parquet.gz").write_bytes(gzip.compress(b"\0" * (4 << 20)))
    with pytest.raises(DatasetError, match=re.escape(f"{tmp_path / 'train.parquet.gz'} is not a compressed parquet "
                                                     f"file (its text starts {bytes(4)!r}, not b'PAR1'); replace it "
                                                     f"with the hub's file")):
        load_split(str(tmp_path), "train")


def test_a_compressed_parquet_file_that_would_fill_the_disk_stops_before_it_does(tmp_path, monkeypatch):
    (tmp_path / "train.parquet.gz").write_bytes(gzip.compress(b"PAR1" + b"\0" * (8 << 20)))
    free = shutil.disk_usage(tempfile.gettempdir()).free
    monkeypatch.setattr("data.local_files.DISK_LEFT_FREE_BYTES", free - (2 << 20))  # 2 MB left to fill
    with pytest.raises(DatasetError, match=r"train.parquet.gz decompresses to more than the .* free \(less .* left "
                                           r"for others\); decompress it yourself where there is room, or set TMPDIR"):
        load_split(str(tmp_path), "train")


def test_a_byte_that_is_not_utf8_in_compressed_text_is_placed_in_the_decompressed_text(tmp_path):
    (tmp_path / "train.txt.xz").write_bytes(lzma.compress(b"line one\nline two caf\xe9\n"))
    with pytest.raises(DatasetError, match=r"train.txt.xz is not UTF-8: byte 0xe9 at offset 21 of its decompressed "
                                           r"text \(line 2\)"):
        load_split(str(tmp_path), "train")


def unusable_folder(tmp_path) -> tuple[Path, str]:
    """The issue's folder: a .txt.gz (read), a .csv and a file without an extension (not), a hidden file."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    plain, packed = SENTENCE.format(i=1) * 40, SENTENCE.format(i=2) * 400
    (folder / "notes.txt").write_text(plain)
    (folder / "more.txt.gz").write_bytes(gzip.compress(packed.encode()))
    (folder / "table.csv").write_text("a,b\n1,2\n")
    (folder / "README").write_text("what this corpus is\n")
    (folder / "data.json").write_text('{"text": "x"}\n')
    (folder / ".notes.txt.swp").write_bytes(b"\0\1")  # hidden: passed over without a word
    return folder, packed + plain


def test_files_that_cannot_be_used_stop_the_run_with_one_line_naming_each(tmp_path):
    folder, _ = unusable_folder(tmp_path)
    with unchanged(CORPUS, folder):
        assert attempt(CORPUS, lambda: prepare(folder)) == "refused"
    with pytest.raises(DatasetError) as refused:
        load_split(str(folder), "train")
    message = str(refused.value)
    assert "holds 3 files that cannot be read as text: README has no extension to say its format; data.json is " \
           ".json, not a format read here, but name it .jsonl if it holds one JSON object per line; table.csv is " \
           ".csv, not a format read here." in message
    assert "--skip-unreadable" in message and "more.txt.gz" not in message and ".swp" not in message


def test_with_skip_unreadable_the_readable_files_train_and_the_rest_are_named_once(tmp_path, capsys):
    folder, _ = unusable_folder(tmp_path)
    readable = tmp_path / "readable"
    readable.mkdir()
    for name in ("notes.txt", "more.txt.gz"):
        (readable / name).write_bytes((folder / name).read_bytes())
    with skipping_unreadable():
        skipped = [load_split(str(folder), split) for split in ("train", "validation", "train")]
    assert all(np.array_equal(tokens, load_split(str(readable), split))
               for tokens, split in zip(skipped, ("train", "validation", "train")))
    err = capsys.readouterr().err
    assert err.count("data: left out 3 files") == 1  # once, however often the corpus is read
    assert "README has no extension to say its format; data.json is .json" in err
    assert "from more.txt.gz (" in err and "notes.txt (" in err
    with pytest.raises(DatasetError, match="cannot be read as text"):  # the skip holds within the block only
        load_split(str(folder), "train")


def test_a_dataset_folder_holding_a_training_run_is_refused(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "runs" / "first" / "training_state").mkdir(parents=True)
    (folder / "runs" / "first" / "metrics.jsonl").write_text('{"step": 1, "loss": 10.9}\n')
    (folder / "train.txt").write_text(SENTENCE.format(i=0) * 50)
    with skipping_unreadable(), pytest.raises(DatasetError, match=r"corpus holds a training run's folder, "
                                                                  r"runs/first \(it has training_state/\): its "
                                                                  r"metrics and checkpoints would be read as text"):
        load_split(str(folder), "train")
    with pytest.raises(DatasetError, match=r"first is a training run's folder"):
        load_split(str(folder / "runs" / "first"), "train")


TRAIN_FLAGS = ["--model", "tiny", "--device", "cpu", "--batch-size", "2", "--block-size", "16", "--max-steps", "1",
               "--eval-batches", "1", "--final-eval-batches", "1", "--eval-interval", "1000", "--no-curves"]


def test_train_py_stops_on_files_it_cannot_use_or_trains_without_them_when_told(tmp_path):
    folder, _ = unusable_folder(tmp_path)
    with unchanged(CORPUS, folder):
        refused = run_command(CORPUS, ["python", "train.py", "--dataset", str(folder), "--out-dir",
                                       str(tmp_path / "refused"), *TRAIN_FLAGS])
        assert refused.returncode != 0 and "table.csv is .csv, not a format read here" in refused.stderr
        assert not (tmp_path / "refused").exists()
        worked = run_command(CORPUS, ["python", "train.py", "--dataset", str(folder), "--out-dir",
                                      str(tmp_path / "run"), "--skip-unreadable", *TRAIN_FLAGS])
    assert "data: left out 3 files" in worked.stderr and (tmp_path / "run" / "model.safetensors").exists()


@pytest.mark.parametrize("out_dir, relation", [("corpus/run", "is inside"), ("corpus", "is"),
                                               ("alias/runs/new", "is inside")])
def test_an_out_dir_inside_the_dataset_is_refused_before_anything_is_written(tmp_path, out_dir, relation):
    import train
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.txt").write_text(SENTENCE.format(i=0) * 50)
    (tmp_path / "alias").symlink_to(folder)  # the same folder under another name
    with unchanged(CORPUS, folder), pytest.raises(SystemExit) as refused:
        train.main(["--dataset", str(folder), "--out-dir", str(tmp_path / out_dir), *TRAIN_FLAGS])
    message = str(refused.value.code)
    check_error_line(message, CORPUS)
    assert message.startswith(f"error: the output folder {tmp_path / out_dir} {relation} the dataset folder "
                              f"{folder}: what the run writes (metrics.jsonl, checkpoints) would be read as "
                              f"training text; give --out-dir a folder outside it")


def test_every_kind_of_file_that_cannot_be_used_is_named_with_its_reason(tmp_path, capsys, monkeypatch):
    folder, elsewhere = tmp_path / "corpus", tmp_path / "elsewhere"
    (folder / ".cache" / "deep").mkdir(parents=True)
    elsewhere.mkdir()
    (folder / "train.txt").write_text(SENTENCE.format(i=0) * 50)
    (folder / ".cache" / "deep" / "table.csv").write_text("hidden, with all it holds\n")
    (folder / "table.csv.gz").write_bytes(gzip.compress(b"a,b\n"))
    (folder / "archive.gz").write_bytes(gzip.compress(b"text\n"))
    (folder / "gone.txt").symlink_to(folder / "missing.txt")
    (folder / "linked").symlink_to(elsewhere)
    os.mkfifo(folder / "pipe.txt")
    (folder / "unpacked.txt").mkdir()  # an archive unpacked under its own name: its files are read
    (folder / "unpacked.txt" / "inside.txt").write_text(SENTENCE.format(i=1) * 50)
    with pytest.raises(DatasetError) as refused:
        load_split(str(folder), "train")
    assert f"{folder} holds 6 files that cannot be read as text: archive.gz has no extension inside .gz to say its " \
           f"format; gone.txt is a symbolic link to {folder / 'missing.txt'}, which does not exist; linked is a link " \
           f"to a folder, which is not followed; pipe.txt is not a file but a named pipe (FIFO); table.csv.gz is " \
           f".csv inside .gz, not a format read here; unpacked.txt is not a file but a folder (its files are " \
           f"listed). Read are .txt/.raw/.text, .jsonl or .parquet, each also compressed (.gz, .bz2, .xz, .zst): " \
           f"convert, rename or remove them, or pass --skip-unreadable (train.py) to go on without them" == \
        str(refused.value)
    for name in ("archive.gz", "gone.txt", "linked", "pipe.txt", "table.csv.gz"):
        (folder / name).unlink()
    with pytest.raises(DatasetError, match=r"holds 1 file that cannot be read as text: unpacked.txt is not a file "
                                           r"but a folder \(its files are listed\)\. .* remove it, or pass "
                                           r"--skip-unreadable \(train.py\) to go on without it$"):
        load_split(str(folder), "train")
    monkeypatch.setenv("RANK", "1")  # a distributed run's other ranks say nothing: rank 0 speaks for them
    capsys.readouterr()
    with skipping_unreadable():
        assert len(load_split(str(folder), "train")) > 0
    assert "left out" not in capsys.readouterr().err


def test_past_ten_files_that_cannot_be_used_the_rest_are_counted(tmp_path):
    (tmp_path / "train.txt").write_text(SENTENCE.format(i=0) * 50)
    for i in range(12):
        (tmp_path / f"part-{i:02d}.csv").write_text("a,b\n")
    with pytest.raises(DatasetError) as refused:
        load_split(str(tmp_path), "train")
    message = str(refused.value)
    assert "holds 12 files" in message and "part-09.csv is .csv" in message and "part-10.csv" not in message
    assert "part-09.csv is .csv, not a format read here; and 2 more. Read are" in message


def test_a_token_file_is_read_only_when_every_part_of_it_is_whole(tmp_path):
    """data/token_files.py's read_tokens at each of its checks' edges, with the exact line each gives."""
    path = tmp_path / "t.bin"
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [MAGIC, VERSION, 3]

    def written(head: np.ndarray, tokens: list[int], tail: bytes = b"") -> Path:
        path.write_bytes(head.tobytes() + np.array(tokens, dtype=np.uint16).tobytes() + tail)
        return path
    top = GPT2_VOCAB_SIZE - 1
    tokens = read_tokens(written(header, [0, 7, top]))
    assert tokens.dtype == np.uint16 and tokens.tolist() == [0, 7, top] and not tokens.flags.writeable
    for count in (1, 600):  # one token; and more than a header's worth of them (2-byte tokens past 1024 bytes)
        sized = header.copy()
        sized[2] = count
        assert read_tokens(written(sized, list(range(count)))).tolist() == list(range(count))
    empty = header.copy()
    empty[2] = 0
    assert read_tokens(written(empty, [])).tolist() == [] and read_tokens(path).dtype == np.uint16
    other_version = np.array([MAGIC, VERSION + 1, 3, *[0] * 253], np.int32)
    older_version = np.array([MAGIC, VERSION - 1, 3, *[0] * 253], np.int32)
    other_magic = np.array([MAGIC + 1, VERSION, 3, *[0] * 253], np.int32)
    cases = [  # each file written when its case runs: they share one path
        (lambda: written(header, [0, 7, top + 1]), f"holds token id {top + 1}, beyond GPT-2's vocabulary of "
                                                   f"{GPT2_VOCAB_SIZE:,}"),
        (lambda: written(header, [0, 7]), "holds 2 tokens but its header says 3: truncated"),
        (lambda: written(header, [0, 7, 8, 9]), "holds 4 tokens but its header says 3"),
        (lambda: written(header, [1] * 600, b"\0"), "ends inside a token (1201 bytes after the header"),
        (lambda: written(header[:255], []), "is 1020 bytes, cut inside its 1024-byte header"),
        (lambda: written(header[:3], []), "is 12 bytes, cut inside its 1024-byte header"),
        (lambda: written(header[:2], []), "is not a token file (bad magic)"),
        (lambda: written(other_version, [0, 7, 8]), f"has format version {VERSION + 1}, this code reads {VERSION}; "
                                                    f"delete it"),
        (lambda: written(older_version, [0, 7, 8]), f"has format version {VERSION - 1}, this code reads {VERSION}"),
        (lambda: written(other_magic, [0, 7, 8]), "is not a token file (bad magic)"),
    ]
    for make, message in cases:
        with pytest.raises(DatasetError) as refused:
            read_tokens(make())
        assert str(refused.value).startswith(f"{path} {message}"), (message, str(refused.value))
        check_error_line(str(refused.value), TOKEN_CACHE)
    with pytest.raises(DatasetError, match=r"missing.bin cannot be read \(No such file or directory\); delete it and "
                                           r"it will be rebuilt"):
        read_tokens(tmp_path / "missing.bin")
