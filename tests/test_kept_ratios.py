"""decode/kept_ratios.py: what a trace cost and saved is kept between processes once its steps have settled, beside
what other processes kept, and no content of the timings file -- any bytes at all -- makes a decision fail or the
file change when read.  That a fresh process decides from the kept figures: tests/test_trace_payback.py."""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from tests.scripted_host import quiet_host
from model.kernel_choice import KernelChoices, host_key, kept_choices
from decode.kept_ratios import TIMINGS_ENV, DEFAULT_TIMINGS, KeptRatios, read_ratios, timings_path
from runtime.kept_file import OFF
from decode.trace_payback import KEEP_AFTER_TRACED_STEPS, TracePayback
from tests.hostile import examples, record, unchanged

def test_ratios_are_kept_once_the_traced_steps_have_settled_and_only_then(tmp_path):
    path, model, shape = tmp_path / "timings.json", _Model(), ("shape",)
    payback = TracePayback(load=quiet_host(), clock=time.perf_counter, kept=KeptRatios(path))
    for seconds in (5.0, 1.0):  # the first eager step is not counted
        payback.note_eager(model, shape, seconds)
    payback.note_trace(model, shape, 30.0)
    for _ in range(KEEP_AFTER_TRACED_STEPS - 1):
        payback.note_traced(model, shape, 0.5)
    assert not path.exists()
    payback.note_traced(model, shape, 0.5)
    assert list(read_ratios(path).values()) == [(30.0, 0.5)]
    path.unlink()
    payback.note_traced(model, shape, 0.5)  # kept once per shape and process, not at every step after
    assert not path.exists()


def test_the_environment_names_the_file_or_turns_it_off(monkeypatch, tmp_path):
    monkeypatch.setenv(TIMINGS_ENV, OFF)
    assert timings_path() is None
    KeptRatios(timings_path()).put("kind", (1.0, 0.5))  # nothing written anywhere
    monkeypatch.setenv(TIMINGS_ENV, str(tmp_path / "t.json"))
    assert timings_path() == tmp_path / "t.json"
    monkeypatch.delenv(TIMINGS_ENV)
    assert timings_path() == DEFAULT_TIMINGS


def test_a_kind_is_added_beside_those_another_process_wrote(tmp_path):
    path = tmp_path / "timings.json"
    KeptRatios(path).put("one", (10.0, 0.5))
    mine = KeptRatios(path)
    assert mine.get("one") == (10.0, 0.5)
    KeptRatios(path).put("two", (20.0, 0.9))  # another process, after mine read the file
    mine.put("three", (30.0, 0.7))
    assert read_ratios(path) == {"one": (10.0, 0.5), "two": (20.0, 0.9), "three": (30.0, 0.7)}
    assert [p.name for p in tmp_path.iterdir()] == ["timings.json"]  # no temporary file left


def test_an_unwritable_place_warns_once_and_keeps_nothing(tmp_path, caplog):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    kept = KeptRatios(blocker / "timings.json")  # its folder cannot be made: a file is in the way
    with caplog.at_level(logging.WARNING, logger="runtime.kept_file"):
        kept.put("one", (10.0, 0.5))
        kept.put("two", (10.0, 0.5))
    [warning] = caplog.messages
    assert "could not keep the trace timings" in warning and TIMINGS_ENV in warning
    assert kept.path is None and blocker.read_text() == ""


# --- hostile contents ---------------------------------------------------------------------------------------------

SURFACE = "trace timings file"
NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**30, 10**30), st.booleans(),
                    st.text(max_size=3), st.none())
VALUES = st.one_of(st.lists(NUMBERS, max_size=3), NUMBERS, st.dictionaries(st.text(max_size=3), NUMBERS, max_size=2))
CONTENTS = st.one_of(
    st.binary(max_size=200),
    st.dictionaries(st.text(max_size=20), VALUES, max_size=5).map(lambda d: json.dumps(d).encode()),
    st.lists(VALUES, max_size=3).map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.text(max_size=20), VALUES, max_size=5).map(lambda d: json.dumps(d).encode()[:-1]),  # cut
)


@contextlib.contextmanager
def timings_file(contents: bytes):
    """A folder of its own holding a timings file of `contents`: (the folder, the file)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "timings.json"
        path.write_bytes(contents)
        yield folder, path


def valid(value) -> bool:
    return (isinstance(value, list) and len(value) == 2
            and all(type(v) in (int, float) and math.isfinite(v) and v > 0 for v in value))


@examples(80)
@given(contents=CONTENTS)
def test_any_timings_file_is_read_for_its_valid_entries_alone_and_left_as_it_was(contents):
    with timings_file(contents) as (folder, path):
        with unchanged(SURFACE, folder):
            kept = read_ratios(path)
        try:
            parsed = json.loads(contents)
        except ValueError:
            parsed = None
        expected = ({k: tuple(float(x) for x in v) for k, v in parsed.items() if valid(v)}
                    if isinstance(parsed, dict) else {})
        assert kept == expected
        assert all(v > 0 and math.isfinite(v) for ratios in kept.values() for v in ratios)
        record(SURFACE, "read" if kept else "ignored")


@examples(20)
@given(contents=CONTENTS)
def test_a_damaged_timings_file_never_stops_a_decision_and_is_replaced_whole_by_the_next_kept_kind(contents):
    with timings_file(contents) as (folder, path):
        kept = KeptRatios(path)
        payback = TracePayback(load=quiet_host(), clock=time.perf_counter, kept=kept)
        model, shape = _Model(), ("shape",)
        payback.note_eager(model, shape, 1.0)
        payback.note_eager(model, shape, 1.0)
        assert payback.traces(model, shape, 10**6, kept=False)  # decided, from the file's figures or the guess
        kept.put("new kind", (10.0, 0.5))
        assert json.loads(path.read_text())["new kind"] == [10.0, 0.5]
        assert sorted(os.listdir(folder)) == ["timings.json"]


class _Model:
    """What step_kind reads of a model: its config and its modules."""
    config = type("Config", (), {"n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 16})()

    def modules(self):
        return iter(())


# The kernel choices file (model/kernel_choice.py) is read by the same reader: any bytes give its string entries.

CHOICES_SURFACE = "kernel choices file"


@examples(60)
@given(contents=CONTENTS)
def test_any_kernel_choices_file_gives_its_names_alone_and_a_choice_is_made_whatever_it_holds(contents):
    with timings_file(contents) as (folder, path):
        with unchanged(CHOICES_SURFACE, folder):
            kept = kept_choices(path).read()
        try:
            parsed = json.loads(contents)
        except ValueError:
            parsed = None
        assert kept == ({k: v for k, v in parsed.items() if isinstance(v, str)} if isinstance(parsed, dict) else {})
        record(CHOICES_SURFACE, "read" if kept else "ignored")
        runs = {"a": lambda: None, "b": lambda: None}
        assert KernelChoices(load=quiet_host(), kept=kept_choices(path)).choose((1, 2, 3), lambda: runs) in runs  # a shape not kept
        assert sorted(os.listdir(folder)) == ["timings.json"]


@examples(40)
@given(value=st.one_of(VALUES, st.text(max_size=8), st.sampled_from(["a", "b"])))
def test_whatever_a_shape_s_kept_entry_holds_its_kernel_is_a_candidate_timed_unless_kept(value):
    shape, runs = (1, 2, 3), {"a": lambda: None, "b": lambda: None}
    with timings_file(json.dumps({host_key(shape): value}).encode()) as (folder, path):
        # an eager product takes a kept name only if it can run it, and never times anything
        untimed = KernelChoices(load=quiet_host(), clock=lambda: pytest.fail("known() timed something"), kept=kept_choices(path))
        assert untimed.known(shape, runs.__contains__) == (value if value in ("a", "b") else None)
        choices = KernelChoices(load=quiet_host(), kept=kept_choices(path))
        chosen = choices.choose(shape, lambda: runs)
        assert chosen in runs
        assert (chosen == value) == (value in ("a", "b")) and (shape in choices.timings) == (value not in ("a", "b"))
        choices.confirm(lambda: None, lambda _: chosen)  # a timed choice is written once the step has judged it
        assert kept_choices(path).read() == {host_key(shape): chosen}
