"""runtime/kept_file.py: a kept file (trace timings, kernel choices) is read as warily as a user's file.  Whatever is
at its path -- JSON nested past the parser's depth, a FIFO, a link to /dev/zero, a file of gigabytes, two processes
writing at once -- a process reads it in bounded time and memory, says once that it ignores it, decides without it,
and the next write replaces it with a whole file."""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from decode.kept_ratios import KeptRatios
from decode.trace_payback import TracePayback
from model.kernel_choice import KernelChoices, kept_choices
from runtime.kept_file import KeptFile, kept_path
from tests.hostile import examples, record

SURFACE = "kept file"
DEEP = 100_000


def _deep_json(path: Path) -> None:
    path.write_text("[" * DEEP + "]" * DEEP)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _two_gigabytes(path: Path) -> None:
    with open(path, "wb") as f:  # sparse: no disk is used, but a reader that trusts the size reads 2 GB
        f.truncate(2 * 1024**3)


def _huge_integer(path: Path) -> None:
    path.write_text('{"k": ' + "1" * 5000 + "}")


def _folder(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_text("{}")


HOSTILE = {"deep JSON": _deep_json, "FIFO": _fifo, "/dev/zero": _dev_zero, "2 GB file": _two_gigabytes,
           "5,000-digit integer": _huge_integer}


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_kept_file_is_ignored_with_one_warning_and_replaced_at_the_next_write(kind, tmp_path, caplog):
    path = tmp_path / "choices.json"
    HOSTILE[kind](path)
    kept = kept_choices(path)
    with caplog.at_level(logging.WARNING, logger="runtime.kept_file"):
        assert kept.get("shape") is None
        assert kept.get("another shape") is None  # read once: one warning, not one per look-up
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "ignoring the kernel choices" in warnings[0] and "\n" not in warnings[0]
    kept.put("shape", "a")
    assert path.is_file() and not path.is_symlink()
    assert json.loads(path.read_text()) == {"shape": "a"}
    assert kept_choices(path).read() == {"shape": "a"}
    record(SURFACE, "ignored", kind)


@pytest.mark.parametrize("kind, named", [("FIFO", "not a regular file (a FIFO)"),
                                         ("/dev/zero", "not a regular file (a device)")])
def test_what_is_in_a_kept_file_s_place_is_named_in_the_warning(kind, named, tmp_path, caplog):
    path = tmp_path / "choices.json"
    HOSTILE[kind](path)
    with caplog.at_level(logging.WARNING, logger="runtime.kept_file"):
        assert kept_choices(path).read() == {}
    [warning] = caplog.messages
    assert f"({named})" in warning, warning


def test_a_folder_in_a_kept_file_s_place_is_ignored_and_the_write_given_up(tmp_path, caplog):
    path = tmp_path / "choices.json"
    _folder(path)
    kept = kept_choices(path)
    with caplog.at_level(logging.WARNING, logger="runtime.kept_file"):
        assert kept.get("shape") is None
        kept.put("shape", "a")
    assert kept.get("shape") == "a"  # this process keeps what it measured
    assert len(caplog.records) == 2 and "could not keep" in caplog.records[1].getMessage()
    assert (path / "inside").read_text() == "{}"


@pytest.mark.parametrize("kind", HOSTILE)
def test_every_decision_is_made_whatever_the_kept_files_hold(kind, tmp_path):
    timings, choices = tmp_path / "timings.json", tmp_path / "choices.json"
    HOSTILE[kind](timings)
    HOSTILE[kind](choices)
    runs = {"a": lambda: None, "b": lambda: None}
    assert KernelChoices(kept=kept_choices(choices)).choose((1, 2, 3), lambda: runs) in runs
    payback = TracePayback(clock=time.perf_counter, kept=KeptRatios(timings))
    model, shape = _Model(), ("shape",)
    payback.note_eager(model, shape, 1.0)
    payback.note_eager(model, shape, 1.0)
    assert payback.traces(model, shape, 10**6, kept=False) in (True, False)


def test_the_variable_names_the_file_off_turns_it_off_and_empty_is_the_default(monkeypatch):
    monkeypatch.setenv("GPT2_KEPT_TEST", "records.json")  # a relative name that sorts after "off"
    assert kept_path("GPT2_KEPT_TEST", Path("/default.json")) == Path("records.json")
    monkeypatch.setenv("GPT2_KEPT_TEST", "~/kept.json")
    assert kept_path("GPT2_KEPT_TEST", Path("/default.json")) == Path.home() / "kept.json"
    monkeypatch.setenv("GPT2_KEPT_TEST", "off")
    assert kept_path("GPT2_KEPT_TEST", Path("/default.json")) is None
    monkeypatch.setenv("GPT2_KEPT_TEST", "")
    assert kept_path("GPT2_KEPT_TEST", Path("/default.json")) == Path("/default.json")


# runtime/kept_file.py's bound, written out so that a changed bound fails the tests below: 4 MiB.
BOUND = 4 * 2**20


def test_a_file_past_the_bound_is_not_read_even_if_it_is_json(tmp_path, caplog):
    path = tmp_path / "choices.json"
    path.write_text(json.dumps({"shape": "a", "pad": "x" * BOUND}))  # 4 MiB and 26 bytes
    with caplog.at_level(logging.WARNING, logger="runtime.kept_file"):
        assert kept_choices(path).read() == {}
    assert "more than" in caplog.records[0].getMessage()


def test_a_file_of_exactly_the_bound_is_read(tmp_path, caplog):
    path = tmp_path / "choices.json"
    text = json.dumps({"shape": "a"})
    path.write_text(text + " " * (BOUND - len(text)))  # JSON allows trailing whitespace
    assert path.stat().st_size == BOUND
    with caplog.at_level(logging.WARNING, logger="runtime.kept_file"):
        assert kept_choices(path).read() == {"shape": "a"}
    assert caplog.messages == []


def test_a_kept_file_of_thousands_of_entries_is_read_whole(tmp_path, caplog):
    """Entries are a few hundred bytes: a file of thousands of them, megabytes, is a real one, not a hostile one."""
    path = tmp_path / "choices.json"
    many = {f"{'cpu and torch and shape ' * 12}{i}": "a" for i in range(8000)}
    path.write_text(json.dumps(many, indent=1))
    assert 2 * 1024**2 < path.stat().st_size < BOUND
    with caplog.at_level(logging.WARNING, logger="runtime.kept_file"):
        assert kept_choices(path).read() == many
    assert caplog.messages == []


def test_a_file_that_grows_past_the_bound_after_its_size_was_read_is_not_read(tmp_path, monkeypatch, caplog):
    """The size checked on the open file, then the file written on by another program: the read itself stops."""
    path = tmp_path / "choices.json"
    text = json.dumps({"shape": "a"})
    path.write_text(text + " " * (BOUND + 10 - len(text)))
    real_fstat = os.fstat
    monkeypatch.setattr(os, "fstat", lambda fd: os.stat_result((*real_fstat(fd)[:6], len(text), *real_fstat(fd)[7:])))
    with caplog.at_level(logging.WARNING, logger="runtime.kept_file"):
        assert kept_choices(path).read() == {}
    [warning] = caplog.messages
    assert f"more than the {BOUND:,} bytes a kept file may hold" in warning


def test_a_kept_file_named_in_folders_not_yet_made_is_written_there(tmp_path, caplog):
    path = tmp_path / "a" / "b" / "choices.json"  # as GPT2_KERNEL_CHOICES may name it
    with caplog.at_level(logging.WARNING, logger="runtime.kept_file"):
        kept_choices(path).put("shape", "a")
    assert caplog.messages == [] and kept_choices(path).read() == {"shape": "a"}


def test_entries_left_out_are_counted_and_a_file_of_every_entry_valid_is_read_in_silence(tmp_path, caplog):
    path = tmp_path / "choices.json"
    many = {f"shape {i}": "a" for i in range(300)}  # past the small integers CPython keeps one object of
    path.write_text(json.dumps(many))
    with caplog.at_level(logging.WARNING, logger="runtime.kept_file"):
        assert kept_choices(path).read() == many
        assert caplog.messages == []
        path.write_text(json.dumps({"a": "x", "b": 1, "c": "y", "d": None}))
        assert kept_choices(path).read() == {"a": "x", "c": "y"}
    [warning] = caplog.messages
    assert warning == f"left out 2 of the 4 kernel choices in {path} that are not kernel names"


def _keep_many(path: str, writer: int, count: int, start) -> None:
    start.wait()
    kept = KeptFile(Path(path), "entries", lambda value: isinstance(value, int), "integers", "UNUSED")
    for i in range(count):
        kept.put(f"{writer}-{i}", i)


def test_two_processes_writing_at_once_keep_every_entry_and_a_reader_sees_whole_files(tmp_path):
    path, count = tmp_path / "kept.json", 40
    context = multiprocessing.get_context("spawn")  # no fork of pytest's threads
    start = context.Barrier(2)
    writers = [context.Process(target=_keep_many, args=(str(path), w, count, start)) for w in range(2)]
    for writer in writers:
        writer.start()
    reader = KeptFile(path, "entries", lambda value: isinstance(value, int), "integers", "UNUSED")
    while any(writer.is_alive() for writer in writers):
        if path.exists():  # never a half-written file: each read is the old whole file or the new one
            assert all(isinstance(v, int) for v in json.loads(path.read_text()).values())
        reader.read()
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    assert reader.read() == {f"{w}-{i}": i for w in range(2) for i in range(count)}
    assert sorted(os.listdir(tmp_path)) == ["kept.json"]


@examples(30)
@given(depth=st.integers(1, 200_000), opener=st.sampled_from(["[", '{"k":']))
def test_json_nested_to_any_depth_is_read_or_ignored_never_raised(depth, opener, tmp_path_factory):
    path = tmp_path_factory.mktemp("kept") / "choices.json"
    closer = "]" if opener == "[" else "}"
    path.write_text(opener * depth + ("1" if opener != "[" else "") + closer * depth)
    outcome = kept_choices(path).read()
    assert outcome == {}
    record(SURFACE, "ignored", f"depth {depth}")


class _Model:
    """What step_kind reads of a model: its config and its modules."""
    config = type("Config", (), {"n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 16})()

    def modules(self):
        return iter(())
