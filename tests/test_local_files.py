"""data/local_files.py's checks on their own, without tokenizing: the reading of each format (JSON lines, parquet),
what a folder's files are taken as, and the exact line for each file or corpus refused -- each answer worked out
from the module's rules, so that a changed condition, bound or message is seen in a second or two."""
from __future__ import annotations

import gzip
import io
import json
import os
import socket
import stat

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.documents import DatasetError
from data.local_files import (ANNOUNCED, LISTED_UNUSABLE, DataFile, _kind, corpus_files, data_file, file_hash,
                              format_problem, local_corpus, skipping_unreadable, unusable_because, unusable_checked)

READ = ".txt/.raw/.text, .jsonl or .parquet, each also compressed (.gz, .bz2, .xz, .zst)"


def documents(path, split: str = "train") -> list[str]:
    return list(local_corpus(path).documents(split))


def folder_documents(path) -> list[str]:
    """The training documents of a folder holding `path` and a validation file: nothing is carved from them."""
    (path.parent / "valid.txt").write_text("held out\n")
    return documents(path.parent)


def refusal(call) -> str:
    with pytest.raises(DatasetError) as refused:
        call()
    return str(refused.value)


# --- JSON lines ------------------------------------------------------------------------------------------------

def jsonl(tmp_path, *lines: str, name: str = "train.jsonl"):
    path = tmp_path / name.split(".")[0] / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_each_json_line_is_a_document_and_blank_lines_are_passed_over_but_counted(tmp_path):
    path = jsonl(tmp_path, '{"text": "one"}', "", "   ", '{"text": "two", "id": 2}', '{"text": ""}')
    assert folder_documents(path) == ["one", "two"]  # an empty text is no document
    bad = jsonl(tmp_path, '{"text": "one"}', "", '{"text": 5}', name="bad.jsonl")
    assert refusal(lambda: documents(bad)) == (f'{bad} line 3 has no "text" field holding a string; each line must '
                                               f'be one object with a "text" field')


@pytest.mark.parametrize("line", ['["text"]', '"text"', '{"txt": "a"}', '{"text": null}', '{"text": ["a"]}', "5"])
def test_a_line_that_is_not_an_object_with_a_text_string_is_named(tmp_path, line):
    path = jsonl(tmp_path, '{"text": "fine"}', line)
    assert refusal(lambda: documents(path)) == (f'{path} line 2 has no "text" field holding a string; each line '
                                                f'must be one object with a "text" field')


@pytest.mark.parametrize("line, reason", [
    ('{"text": "a"', "Expecting ',' delimiter: line 2 column 1 (char 13)"),  # the line's newline is char 13
    ("[" * 100_000 + "]" * 100_000, "nested deeper than the parser can follow; arrays and objects must not nest so "
                                    "deep"),
    ('{"text": "a", "n": ' + "9" * 5000 + "}", "holds an integer of more than 4300 digits"),
    ('{"text": "a"} x', "Extra data: line 1 column 15 (char 14)"),
])
def test_a_line_that_is_not_json_is_one_error_saying_why(tmp_path, line, reason):
    path = jsonl(tmp_path, '{"text": "fine"}', "", line)
    assert refusal(lambda: documents(path)) == (f"{path} line 3 is not a JSON object ({reason}); each line must be "
                                                f'one object with a "text" field')


def test_a_lone_surrogate_is_named_by_its_code(tmp_path):
    path = jsonl(tmp_path, json.dumps({"text": "ok"}), '{"text": "half \\udbff of it"}')
    assert refusal(lambda: documents(path)) == (f'{path} line 2: its "text" holds a lone surrogate (\\udbff), half of '
                                                f'a character; remove it or re-export the file with whole characters')


def test_a_compressed_json_lines_file_reports_progress_in_its_own_bytes(tmp_path):
    path = tmp_path / "train.jsonl.gz"
    path.write_bytes(gzip.compress("".join(json.dumps({"text": f"doc {i} " * 50}) + "\n"
                                           for i in range(2000)).encode()))
    corpus = local_corpus(path)
    took = []
    docs = [doc for _, doc in corpus.text_pass("train").read(took.append)]
    assert len(docs) == 2000 and docs[7] == "doc 7 " * 50
    assert sum(took) == path.stat().st_size and all(n > 0 for n in took) and len(took) > 1


def test_a_plain_json_lines_file_reports_each_lines_bytes(tmp_path):
    path = jsonl(tmp_path, '{"text": "a"}', "", '{"text": "bb"}')
    took = []
    list(local_corpus(path).text_pass("train").read(took.append))
    assert took == [len('{"text": "a"}\n'), 1, len('{"text": "bb"}\n')]


# --- parquet ---------------------------------------------------------------------------------------------------

def parquet(path, **columns):
    pq.write_table(pa.table(columns), path)
    return path


def test_parquet_text_in_any_string_layout_is_read_and_a_null_row_is_empty(tmp_path):
    texts = ["first document", None, "third document"]
    for i, array in enumerate([pa.array(texts, pa.string()), pa.array(texts, pa.large_string()),
                               pa.array(texts, pa.string_view()), pa.array(texts, pa.string()).dictionary_encode()]):
        (tmp_path / str(i)).mkdir()
        path = parquet(tmp_path / str(i) / "train.parquet", text=array)
        assert pq.ParquetFile(path).schema_arrow.field("text").type == array.type  # read back as written
        assert folder_documents(path) == ["first document", "third document"], array.type


@pytest.mark.parametrize("column, kind", [(pa.array([1, 2]), "int64"), (pa.array([b"a", b"b"]), "binary"),
                                         (pa.array([b"a", b"b"]).dictionary_encode(), "dictionary<values=binary, "
                                                                                      "indices=int32, ordered=0>")])
def test_a_text_column_that_holds_no_strings_is_named_with_its_type(tmp_path, column, kind):
    path = parquet(tmp_path / "train.parquet", text=column)
    assert refusal(lambda: documents(path)) == (f'{path}: the "text" column holds {kind}, not strings; replace it '
                                                f"with the hub's file")


def test_a_parquet_file_without_a_text_column_or_not_parquet_at_all_is_named(tmp_path):
    path = parquet(tmp_path / "train.parquet", body=pa.array(["a"]))
    assert refusal(lambda: documents(path)) == (
        f'{path} is not a readable parquet file with a "text" column (\'Column text does not exist in schema\'); '
        f"replace it with the hub's file")
    fake = tmp_path / "other" / "train.parquet"
    fake.parent.mkdir()
    fake.write_text("short\n")
    assert refusal(lambda: documents(fake)) == (
        f'{fake} is not a readable parquet file with a "text" column (Parquet file size is 6 bytes, smaller than the '
        f"minimum file footer (8 bytes)); replace it with the hub's file")


def test_a_parquet_file_gone_between_listing_and_reading_is_one_line(tmp_path):
    path = parquet(tmp_path / "train.parquet", text=pa.array(["a"]))
    text_pass = local_corpus(path).text_pass("train")  # listed, sized and hashed
    path.unlink()
    with pytest.raises(DatasetError) as refused:
        list(text_pass.read(lambda n: None))
    assert str(refused.value).startswith(f'{path} is not a readable parquet file with a "text" column ([Errno 2] '
                                         f"Failed to open local file ")


def test_parquet_progress_adds_up_to_the_files_bytes(tmp_path):
    path = parquet(tmp_path / "train.parquet", text=pa.array([f"document {i}" for i in range(10_000)]))
    took = []
    docs = [doc for _, doc in local_corpus(path).text_pass("train").read(took.append)]
    assert len(docs) == 10_000 and sum(took) == path.stat().st_size and len(took) == 3  # 4,096 rows a read
    one = parquet(tmp_path / "one.parquet", text=pa.array(["a single document"]))
    took = []
    assert [doc for _, doc in local_corpus(one).text_pass("train").read(took.append)] == ["a single document"]
    assert took == [one.stat().st_size]


# --- what a folder's files are taken as -------------------------------------------------------------------------

@pytest.mark.parametrize("name, problem", [
    ("a.txt", None), ("a.RAW", None), ("a.Text", None), ("a.jsonl", None), ("a.parquet", None),
    ("a.txt.gz", None), ("a.JSONL.ZST", None), ("a.parquet.xz", None), ("a.txt.bz2", None),
    ("table.csv", "is .csv, not a format read here"),
    ("data.json", "is .json, not a format read here, but name it .jsonl if it holds one JSON object per line"),
    ("data.json.gz", "is .json inside .gz, not a format read here, but name it .jsonl if it holds one JSON object "
                     "per line"),
    ("README", "has no extension to say its format"), ("archive.zst", "has no extension inside .zst to say its format"),
    ("a.tar.gz", "is .tar inside .gz, not a format read here"), ("a.txt.zip", "is .zip, not a format read here")])
def test_a_files_name_says_its_format_or_why_it_has_none_read_here(tmp_path, name, problem):
    assert format_problem(tmp_path / name) == problem


def test_what_is_not_a_regular_file_is_named_for_what_it_is(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "unpacked.txt").mkdir()
    os.mkfifo(tmp_path / "pipe.txt")
    (tmp_path / "null.txt").symlink_to("/dev/null")
    (tmp_path / "gone.txt").symlink_to(tmp_path / "missing.txt")
    (tmp_path / "loop.txt").symlink_to("loop.txt")
    (tmp_path / "linked").symlink_to(tmp_path / "folder")
    (tmp_path / "file.txt").write_text("text")
    (tmp_path / "file.csv").write_text("a,b")
    assert unusable_because(tmp_path / "folder") == ""
    assert unusable_because(tmp_path / "unpacked.txt") == "is not a file but a folder (its files are listed)"
    assert unusable_because(tmp_path / "pipe.txt") == "is not a file but a named pipe (FIFO)"
    assert unusable_because(tmp_path / "null.txt") == "is not a file but a device"
    assert unusable_because(tmp_path / "gone.txt") == (f"is a symbolic link to {tmp_path / 'missing.txt'}, which "
                                                       f"does not exist")
    assert unusable_because(tmp_path / "loop.txt") == "is a symbolic link to loop.txt, which loops back on itself"
    assert unusable_because(tmp_path / "linked") == "is a link to a folder, which is not followed"
    assert unusable_because(tmp_path / "file.txt") is None
    assert unusable_because(tmp_path / "file.csv") == "is .csv, not a format read here"
    assert unusable_because(tmp_path / "nothing.txt") == "cannot be read (No such file or directory)"


def test_each_kind_of_file_has_its_name():
    assert [_kind(mode) for mode in (stat.S_IFDIR, stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK)] == [
        "a folder", "a named pipe (FIFO)", "a socket", "a device", "a device"]


def test_a_socket_in_a_corpus_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a socket's path is short-limited: bind it by a relative name
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind("s.txt")
        assert unusable_because(tmp_path / "s.txt") == "is not a file but a socket"


def test_a_corpus_file_given_directly_is_a_regular_file_or_one_line_naming_what_it_is(tmp_path):
    (tmp_path / "t.txt.gz").write_bytes(gzip.compress(b"text"))
    assert data_file(tmp_path / "t.txt.gz") == DataFile(tmp_path / "t.txt.gz", "text",
                                                        (tmp_path / "t.txt.gz").stat().st_size, "gzip")
    (tmp_path / "p.parquet").write_bytes(b"x" * 7)
    assert data_file(tmp_path / "p.parquet") == DataFile(tmp_path / "p.parquet", "parquet", 7, None)
    os.mkfifo(tmp_path / "pipe.jsonl")
    assert refusal(lambda: data_file(tmp_path / "pipe.jsonl")) == (
        f"{tmp_path / 'pipe.jsonl'} is not a file but a named pipe (FIFO); it should hold the split's text, remove "
        f"it or rename it to another extension")
    (tmp_path / "gone.txt").symlink_to(tmp_path / "missing.txt")
    assert refusal(lambda: data_file(tmp_path / "gone.txt")) == (
        f"{tmp_path / 'gone.txt'} is a symbolic link to {tmp_path / 'missing.txt'}, which does not exist; remove the "
        f"link or point it at the file")
    (tmp_path / "loop.txt").symlink_to("loop.txt")
    assert refusal(lambda: data_file(tmp_path / "loop.txt")).endswith("loop.txt, which loops back on itself; remove "
                                                                       "the link or point it at the file")
    assert refusal(lambda: data_file(tmp_path / "none.txt")) == (
        f"{tmp_path / 'none.txt'} cannot be read (No such file or directory); check its permissions")
    assert refusal(lambda: file_hash(tmp_path / "none.txt")) == (
        f"{tmp_path / 'none.txt'} cannot be read (No such file or directory); check its permissions")


def test_hidden_entries_are_passed_over_at_any_depth_and_links_named_training_state_are_files(tmp_path):
    (tmp_path / "a" / ".hidden").mkdir(parents=True)
    (tmp_path / "a" / ".hidden" / "x.csv").write_text("a")
    (tmp_path / "a" / ".notes.csv").write_text("a")
    (tmp_path / "a" / "b.txt").write_text("b")
    (tmp_path / "z.txt").write_text("z")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "a" / "training_state").symlink_to(tmp_path / "elsewhere")  # a link: not a run's folder
    (tmp_path / "training_state.txt").write_text("text")
    usable, unusable = corpus_files(tmp_path)
    assert usable == [tmp_path / "a" / "b.txt", tmp_path / "training_state.txt", tmp_path / "z.txt"]
    assert unusable == {tmp_path / "a" / "training_state": "is a link to a folder, which is not followed"}
    assert corpus_files(tmp_path / "z.txt") == ([tmp_path / "z.txt"], {})


def test_a_training_runs_folder_at_the_top_or_below_is_refused(tmp_path):
    (tmp_path / "runs" / "one" / "training_state").mkdir(parents=True)
    assert refusal(lambda: corpus_files(tmp_path)) == (
        f"{tmp_path} holds a training run's folder, runs/one (it has training_state/): its metrics and checkpoints "
        f"would be read as text; move the run out of the dataset folder, or give --dataset a folder without it")
    run = tmp_path / "runs" / "one"
    assert refusal(lambda: corpus_files(run)).startswith(f"{run} is a training run's folder (it has training_state/)")
    (tmp_path / "file" / "training_state").parent.mkdir()
    (tmp_path / "file" / "training_state").write_text("a file, not a run's folder")
    assert corpus_files(tmp_path / "file") == ([], {tmp_path / "file" / "training_state": "has no extension to say "
                                                                                      "its format"})


# --- the line naming the files that cannot be used --------------------------------------------------------------

def unusable_of(tmp_path, count: int) -> dict:
    return {tmp_path / f"f{i:02d}.csv": "is .csv, not a format read here" for i in range(count)}


@pytest.mark.parametrize("count, named, more", [(1, 1, ""), (2, 2, ""), (LISTED_UNUSABLE, 10, ""),
                                                (LISTED_UNUSABLE + 1, 10, "; and 1 more"),
                                                (LISTED_UNUSABLE + 5, 10, "; and 5 more"),
                                                (LISTED_UNUSABLE + 15, 10, "; and 15 more")])
def test_the_refusal_names_the_first_ten_files_and_counts_the_rest(tmp_path, count, named, more):
    listed = "; ".join(f"f{i:02d}.csv is .csv, not a format read here" for i in range(named))
    files, them = ("1 file", "it") if count == 1 else (f"{count} files", "them")
    assert refusal(lambda: unusable_checked(tmp_path, unusable_of(tmp_path, count))) == (
        f"{tmp_path} holds {files} that cannot be read as text: {listed}{more}. Read are {READ}: convert, rename or "
        f"remove {them}, or pass --skip-unreadable (train.py) to go on without {them}")
    unusable_checked(tmp_path, {})  # nothing to name


def test_skipping_names_the_files_once_and_only_on_rank_zero(tmp_path, capsys, monkeypatch):
    ANNOUNCED.clear()
    with skipping_unreadable():
        for _ in range(2):
            unusable_checked(tmp_path, unusable_of(tmp_path, 2))
    assert capsys.readouterr().err == (f"data: left out 2 files of {tmp_path} that cannot be read as text "
                                       f"(--skip-unreadable): f00.csv is .csv, not a format read here; f01.csv is "
                                       f".csv, not a format read here\n")
    monkeypatch.setenv("RANK", "3")
    with skipping_unreadable():
        unusable_checked(tmp_path, unusable_of(tmp_path, 1))
    assert capsys.readouterr().err == ""
    with skipping_unreadable(False):
        assert "holds 1 file" in refusal(lambda: unusable_checked(tmp_path, unusable_of(tmp_path, 1)))


# --- the corpus ------------------------------------------------------------------------------------------------

def test_a_dataset_that_is_not_there_or_not_a_corpus_file_is_named(tmp_path):
    assert refusal(lambda: local_corpus(tmp_path / "nowhere")).startswith(
        f"dataset {str(tmp_path / 'nowhere')!r} is neither a known name (")
    (tmp_path / "notes.csv").write_text("a,b")
    assert refusal(lambda: local_corpus(tmp_path / "notes.csv")) == (
        f'{tmp_path / "notes.csv"} is not a corpus file: use .txt or .raw (text), .jsonl (a "text" field per line) or '
        f'.parquet (a "text" column), each also compressed (.gz, .bz2, .xz, .zst)')
    (tmp_path / "empty").mkdir()
    assert refusal(lambda: local_corpus(tmp_path / "empty")).startswith(f"{tmp_path / 'empty'} holds no corpus files")


def test_a_split_that_is_not_there_is_named_with_what_would_give_it(tmp_path):
    (tmp_path / "valid.txt").write_text("held out\n")
    assert refusal(lambda: documents(tmp_path, "train")) == (
        f"{tmp_path} has no train split: expected wiki.train.raw, train-*.parquet or another file whose name says "
        f"'train'")
    (tmp_path / "train.txt").write_text("training\n")
    assert refusal(lambda: documents(tmp_path, "test")) == (
        f"{tmp_path} has no test split: expected wiki.test.raw, test-*.parquet or another file whose name says "
        f"'test', or a training split to carve it from")
    assert documents(tmp_path, "validation") == ["held out\n"] and documents(tmp_path, "train") == ["training\n"]


def test_a_damaged_page_is_named_by_the_rows_read_before_it_and_the_readers_reason(tmp_path):
    """Row 7,000's text is not UTF-8: the rows are read 4,096 at a time, so the batch from row 4,096 fails."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({"text": pa.array([f"line {i} of text" for i in range(10_000)])}), buffer,
                   row_group_size=5000, compression="none")
    data = buffer.getvalue()
    at = data.index(b"line 7000 ")
    (tmp_path / "c").mkdir()
    path = tmp_path / "c" / "train.parquet"
    path.write_bytes(data[:at] + b"\xff\xfe" + data[at + 2:])
    assert refusal(lambda: folder_documents(path)) == (
        f"{path} is damaged after row 4,096 ('utf-8' codec can't decode byte 0xff in position 0: invalid start byte); "
        f"replace it with the hub's file")


def test_a_folder_of_test_text_alone_has_no_split_to_train_on_or_carve_validation_from(tmp_path):
    (tmp_path / "test.txt").write_text("test text\n")
    for split in ("train", "validation"):
        hint = ", or a training split to carve it from" if split == "validation" else ""
        assert refusal(lambda: documents(tmp_path, split)) == (
            f"{tmp_path} has no {split} split: expected wiki.{split[:5] if split == 'train' else 'valid'}.raw, "
            f"{split}-*.parquet or another file whose name says {split!r}{hint}")
    assert documents(tmp_path, "test") == ["test text\n"]


# --- the same text twice (issue 71) ------------------------------------------------------------------------------

PASSAGE = "A passage of its own , number {i} .\n\n"


def test_a_file_and_its_gz_copy_are_named_as_one_text_and_refused_before_any_token_is_kept(tmp_path):
    text = "".join(PASSAGE.format(i=i) * 30 for i in range(400))
    (tmp_path / "wiki.txt").write_text(text)
    (tmp_path / "wiki.txt.gz").write_bytes(gzip.compress(text.encode()))
    assert refusal(lambda: documents(tmp_path)) == (
        f"wiki.txt and wiki.txt.gz in {tmp_path} hold the same text once decompressed: its text would be read "
        f"twice, and a passage held out of one for validation would be training text in the other; remove one of "
        f"them (or move it out of the folder)")


def test_two_files_of_the_same_bytes_are_named_before_they_are_read(tmp_path):
    (tmp_path / "a.txt").write_text("the same words\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "copy.txt").write_text("the same words\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "also-empty.txt").write_text("")  # empty files are alike without being copies
    assert refusal(lambda: local_corpus(tmp_path)) == (
        f"a.txt and b/copy.txt in {tmp_path} hold the same bytes: its text would be read twice, and a passage held "
        f"out of one for validation would be training text in the other; remove one of them (or move it out of the "
        f"folder)")


def test_no_carved_passage_is_also_training_text_when_passages_repeat(tmp_path):
    # every record appears three times, so each carved one has copies before or after it
    records = [json.dumps({"text": f"record {i % 300} of a corpus that repeats itself"}) for i in range(900)]
    (tmp_path / "corpus.jsonl").write_text("\n".join(records) + "\n")
    corpus = local_corpus(tmp_path)
    passes = {split: set(corpus.documents(split)) for split in ("train", "validation", "test")}
    assert passes["validation"] and passes["test"]
    assert not passes["validation"] & passes["train"] and not passes["test"] & passes["train"]
    assert not passes["validation"] & passes["test"]
