"""data/documents.py on its own: where text is cut into documents (at article headings, at the best boundary before
the bound), that the cut never depends on how the text arrived in pieces, the bound a corpus's size gives, and the
exact error line for text that is not UTF-8 -- its byte, offset and line, across the reader's block boundaries and
inside compressed files.  Each answer here is worked out from the rules, so a changed comparison or bound fails."""
from __future__ import annotations

import gzip
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data.documents import (BLOCK_CHARS, MAX_DOCUMENT_CHARS, MIN_DOCUMENT_CHARS, DatasetError, DocumentCutter,
                            _cut_point, cut_documents, document_bound, split_articles, text_blocks,
                            unreadable_stream)
from runtime.errors import UserError

FIX = "convert it"


def test_the_bounds_are_a_mebi_character_document_from_4_kib_and_4_mib_blocks():
    assert (MAX_DOCUMENT_CHARS, MIN_DOCUMENT_CHARS, BLOCK_CHARS) == (2**20, 4096, 4 * 2**20)


@pytest.mark.parametrize("total, bound", [
    (0, 4096), (4096 * 4000 - 1, 4096), (4096 * 4000, 4096), (5000 * 4000 + 3999, 5000),
    (2**20 * 4000 - 1, 2**20 - 1), (2**20 * 4000, 2**20), (10**15, 2**20)])
def test_the_document_bound_keeps_some_4000_documents_in_a_small_corpus(total, bound):
    assert document_bound(total) == bound


@pytest.mark.parametrize("text, lo, cut", [
    ("aaaa\n\nbbbb\ncccc dddd", 0, 6),  # after the last blank line
    ("aa\n  \nbb\ncc dd", 0, 6),  # a line of spaces is blank
    ("aaaa\nbbbb\ncccc dddd", 0, 10),  # else after the last line
    ("aaaa\nbbbb\n\ncccc dddd", 0, 11),
    ("aaaa bbbb\tcccc", 0, 10),  # else after the last space or tab
    ("aaaa\tbbbb cccc", 0, 10),
    ("aaaaaaaaaaaaaa", 0, 14),  # else at the end
    ("a\n\nbbbbbbbb cc", 4, 12),  # only within [lo, hi)
    ("a\n\nbbbbbbbbbbb", 4, 14),
    ("\nbbbb\ncc", 1, 6),
    ("          \naaaaa\nbbbbb", 5, 17),  # blank text before the range is no blank line within it
])
def test_a_cut_falls_at_the_best_boundary_within_its_range(text, lo, cut):
    assert _cut_point(text, lo, len(text)) == cut


def test_a_cut_never_looks_past_its_range():
    assert _cut_point("aaaa bbbb cccc", 0, 9) == 5  # the space at 9 is outside
    assert _cut_point("aa\n\nbb\ncc\n", 0, 6) == 4  # the newline at 6 is outside: the blank line ending at 3 wins
    assert _cut_point("aa\n\nbb\ncc\n", 0, 7) == 4


def test_text_longer_than_the_bound_is_cut_at_spaces_into_documents_no_longer_than_it():
    assert list(cut_documents(["aaa bbb ccc ddd eee"], 10)) == ["aaa bbb ", "ccc ddd ", "eee"]
    assert list(cut_documents(["aaaaaaaaaaaaaaaaaaaaaaaaa"], 10)) == ["aaaaaaaaaa", "aaaaaaaaaa", "aaaaa"]
    assert list(cut_documents(["0123456789"], 10)) == ["0123456789"]  # exactly the bound: one document
    assert list(cut_documents(["0123456789a"], 10)) == ["0123456789", "a"]
    assert list(cut_documents(["aaaa\nbbbb\ncc\n"], 10)) == ["aaaa\nbbbb\n", "cc\n"]
    assert list(cut_documents(["aaaa\nbbbb\nc\n"], 12)) == ["aaaa\nbbbb\nc\n"]


def test_each_article_heading_starts_a_document_and_blank_text_is_none():
    text = "intro\n = A = \nbody a\n = B = \nbody b\n"
    assert list(split_articles(text)) == ["intro\n", " = A = \nbody a\n", " = B = \nbody b\n"]
    assert list(split_articles("\n\n = A = \nx\n")) == ["\n\n = A = \nx\n"]  # nothing but blanks before it
    assert list(split_articles(" = A = \nx\n = B = \ny")) == [" = A = \nx\n", " = B = \ny"]
    assert list(split_articles("x\n = = \ny\n = Sub = = \nz\n")) == ["x\n = = \ny\n", " = Sub = = \nz\n"]
    assert list(split_articles("x\n == B == \ny\n")) == ["x\n == B == \ny\n"]  # not a top-level heading
    assert list(split_articles("  \n\n\t\n")) == [] and list(split_articles("")) == []


def test_a_long_article_is_cut_before_its_bound_and_the_next_heading_still_starts_one():
    text = "x\n = A = \n" + "word " * 6 + "\n = B = \nend\n"
    assert list(cut_documents([text], 16)) == ["x\n", " = A = \nword ", "word word word ", "word word \n",
                                             " = B = \nend\n"]


def test_a_line_longer_than_the_bound_is_cut_before_its_end_arrives():
    cutter = DocumentCutter(8)
    assert list(cutter.feed("abcd efgh ijkl mnop")) == ["abcd ", "efgh ", "ijkl "] and cutter.pending == "mnop"
    assert list(cutter.feed("q")) == [] and cutter.pending == "mnopq"
    assert list(cutter.feed("rstu")) == ["mnopqrst"] and cutter.pending == "u"
    assert list(cutter.finish()) == ["u"] and cutter.pending == ""
    assert list(cutter.finish()) == []


def test_the_cutter_gives_back_whole_lines_only_and_keeps_the_rest():
    cutter = DocumentCutter(100)
    assert list(cutter.feed("a\n = A")) == [] and cutter.pending == "a\n = A"
    assert list(cutter.feed(" = \nb\n")) == ["a\n"] and cutter.pending == " = A = \nb\n"


def test_text_of_exactly_the_bound_is_one_document_though_a_blank_line_would_give_a_cut():
    for text in ("word\n" * 12 + "\n" + "word\n" * 7, "word\n" * 12 + "\n" + "word\n" * 6 + "word "):
        assert list(cut_documents([text], max_chars=len(text))) == [text]
        assert list(cut_documents([text], max_chars=len(text) - 1))[0] == "word\n" * 12 + "\n"  # the cut it had


TEXT = st.lists(st.sampled_from(["word", " ", "  ", "\n", "\n\n", " = Head = ", "\t", "é", "x" * 13, " = = "]),
                max_size=40).map("".join)


@settings(max_examples=150, deadline=None)
@given(text=TEXT, cuts=st.lists(st.integers(0, 400), max_size=6), bound=st.integers(4, 40))
def test_documents_depend_on_the_text_alone_never_on_its_pieces(text, cuts, bound):
    edges = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    pieces = [text[a:b] for a, b in zip(edges, edges[1:])]
    whole = list(cut_documents([text], bound))
    assert list(cut_documents(pieces, bound)) == whole
    assert all(len(doc) <= bound for doc in whole)
    # Nothing is lost but blank stretches: the documents hold every character that is not white space, in order.
    assert re.sub(r"\s", "", "".join(whole)) == re.sub(r"\s", "", text)


def test_a_dataset_error_is_a_user_error_and_a_value_error():
    assert issubclass(DatasetError, UserError) and issubclass(DatasetError, ValueError)


def test_blocks_are_at_most_the_block_size_and_progress_adds_up_to_the_files_bytes(tmp_path):
    plain = tmp_path / "big.txt"
    text = "é" * (BLOCK_CHARS + 10) + "\r\nend"
    plain.write_bytes(text.encode())
    for path, compression in [(plain, None), (tmp_path / "big.txt.gz", "gzip")]:
        if compression:
            path.write_bytes(gzip.compress(plain.read_bytes()))
        took = []
        blocks = list(text_blocks(path, FIX, took.append, compression))
        assert [len(b) for b in blocks] == [BLOCK_CHARS, 14]
        assert "".join(blocks) == text.replace("\r\n", "\n")  # newlines as text mode reads them
        assert sum(took) == path.stat().st_size and all(n >= 0 for n in took)
    three = tmp_path / "three.txt"  # three blocks: each reports its own bytes, not a mix of running positions
    three.write_bytes(("é" * (2 * BLOCK_CHARS + 3)).encode())
    took = []
    assert len(list(text_blocks(three, FIX, took.append))) == 3 and sum(took) == three.stat().st_size


def test_something_that_is_not_a_file_is_named(tmp_path):
    with pytest.raises(DatasetError, match=re.escape(f"{tmp_path} is not a file; it should hold the split's text")):
        list(text_blocks(tmp_path, FIX))


def not_utf8(path, compression=None) -> str:
    with pytest.raises(DatasetError) as refused:
        list(text_blocks(path, FIX, compression=compression))
    return str(refused.value)


@pytest.mark.parametrize("before", [0, 1, 5, 2**20 - 2, 2**20 - 1, 2**20, 2**20 + 1, 2**21 + 3])
def test_a_byte_that_is_not_utf8_is_named_by_offset_and_line_across_block_edges(tmp_path, before):
    """The bad byte lies after `before` bytes (a newline every 100), sometimes right after a character's first
    byte at the edge of a 1 MiB read, where the decoder still holds part of it."""
    head = bytearray(b"a" * before)
    head[99::100] = b"\n" * len(head[99::100])
    line = head.count(b"\n") + 1
    # (bytes after the head, where in them the bad byte is): the last, a whole character held at a read's edge
    # before it
    for bad, at in [(b"\xff", 0), (b"\xc3(", 0), (b"\xe2\x82(", 0), (b"\xc3\xa9x\xff", 3)]:
        path, offset = tmp_path / "bad.txt", before + at
        path.write_bytes(bytes(head) + bad + b"tail\n")
        assert not_utf8(path) == (f"{path} is not UTF-8: byte 0x{bad[at]:02x} at offset {offset} (line {line}); {FIX}")
        packed = tmp_path / "bad.txt.gz"
        packed.write_bytes(gzip.compress(path.read_bytes()))
        assert not_utf8(packed, "gzip") == (f"{packed} is not UTF-8: byte 0x{bad[at]:02x} at offset {offset} of its "
                                            f"decompressed text (line {line}); {FIX}")


def test_a_file_that_cannot_be_opened_is_one_error_naming_it(tmp_path, monkeypatch):
    path = tmp_path / "locked.txt"
    path.write_text("text\n")

    def refused(*args):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr("data.documents.open_stream", refused)
    with pytest.raises(DatasetError) as error:
        list(text_blocks(path, FIX))
    assert str(error.value) == f"{path} cannot be read (Permission denied); check its permissions"


def test_text_that_ends_inside_a_character_says_so(tmp_path):
    path = tmp_path / "cut.txt"
    path.write_bytes(b"line\n" * 3 + "é".encode()[:1])
    assert not_utf8(path) == f"{path} ends inside a UTF-8 character; {FIX}"


def test_a_stream_that_stops_being_readable_names_the_file_and_its_compression(tmp_path):
    path = tmp_path / "a.txt"
    assert str(unreadable_stream(path, None, OSError("disk gone\nsecond line"))) == (
        f"{path} cannot be read (disk gone); check the disk or copy the file again")
    assert str(unreadable_stream(path, "gzip", EOFError())) == (
        f"{path} is not a whole gzip file (EOFError); compress it again or replace it")
    damaged = tmp_path / "b.txt.gz"
    damaged.write_bytes(gzip.compress(b"text " * 1000)[:-30])
    with pytest.raises(DatasetError, match=re.escape(f"{damaged} is not a whole gzip file (")):
        list(text_blocks(damaged, FIX, compression="gzip"))
