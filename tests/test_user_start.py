"""bench/experiments/user_start.py: its summary of a timeline (ratios of each side against the fixed path and ONNX
Runtime in the same rounds, the time to recover after the load, a reason wherever a span has no ratio), its rows that
say which path they timed and that the warm-ups overlapped, and one small run of its sides as users start them:
sample.py's call, a server with one streaming client, the fixed path, and ONNX Runtime where it imports."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from bench.experiments import user_start
from bench.experiments.user_start import (LABELS, SPANS, Call, Settings, UserStart, assigned, paired, pinned, recovery,
                                          section, summarize, twins)
from bench.experiment import SettingsError
from bench.peers.host_rates import HostRates
from bench.report_page import Page
from runtime.timing import environment

RATES = HostRates(30.0, 120.0, 2, [0, 1])


def timeline(default_after: list[float], spans=SPANS) -> list[Call]:
    """Rounds of a second per call: the fixed path at 100 tokens/s throughout (50 under load), the default at 100
    before the load, 50 under it, then `default_after` one round at a time."""
    calls, now, round_ = [], 0.0, 0

    def call(side, speed, span):
        nonlocal now
        calls.append(Call(side, 0 if side == "default" else 1, round_, now, now + 1.0, speed, span, 2, 0.5))
        now += 1.0
    for _ in range(5 if SPANS[0] in spans else 0):
        call("default", 100.0, SPANS[0])
        call("fixed", 100.0, SPANS[0])
        round_ += 1
    for _ in range(5 if SPANS[1] in spans else 0):
        call("fixed", 50.0, SPANS[1])
        call("default", 50.0, SPANS[1])
        round_ += 1
    for speed in default_after if SPANS[2] in spans else []:
        call("default", speed, SPANS[2])
        call("fixed", 100.0, SPANS[2])
        round_ += 1
    return calls


def test_each_side_is_set_against_the_fixed_path_in_the_same_round():
    assert paired(timeline([60.0])[-2:], "default", "fixed") == [pytest.approx(0.6)]
    calls = [Call("fixed", 0, 0, 0, 1, 100.0, SPANS[0], 2, 0), Call("default", 1, 0, 1, 2, 90.0, SPANS[0], 2, 0),
             Call("default", 2, 0, 2, 3, 70.0, SPANS[0], 2, 0), Call("default", 1, 1, 3, 4, 50.0, SPANS[0], 2, 0)]
    assert paired(calls, "default", "fixed") == [pytest.approx(0.8)]  # its processes' median; round 1 has no fixed


def test_recovery_counts_each_process_s_own_calls_and_the_wall_clock_until_it_is_back_within_five_percent():
    calls = timeline([60.0, 80.0, 96.0, 99.0, 100.0])
    load_end = 20.0
    back = recovery(calls, "default", load_end)  # the third default call after it, and the next stays
    assert (back.own_s, back.wall_s) == (pytest.approx(3.0), pytest.approx(6.0 - 1.0))
    assert recovery(timeline([60.0, 70.0]), "default", load_end) is None  # never back within the span
    assert recovery(timeline([96.0, 60.0, 96.0]), "default", load_end).own_s == pytest.approx(3.0)  # it must stay
    assert recovery(timeline([96.0]), "default", load_end).own_s == pytest.approx(1.0)  # its last call
    # a call begun before the load ended is not one after it
    assert recovery(timeline([100.0, 100.0]), "default", load_end + 0.5).own_s == pytest.approx(1.0)
    late = timeline([96.0] * 3) + [Call("default", 7, 20, 30.0, 31.0, 10.0, SPANS[2], 2, 0.5),
                                   Call("default", 7, 21, 31.0, 32.0, 99.0, SPANS[2], 2, 0.5),
                                   Call("default", 7, 22, 32.0, 33.0, 99.0, SPANS[2], 2, 0.5)]
    back = recovery(late, "default", load_end)  # every process of the side must be back: the slowest counts
    assert (back.own_s, back.wall_s) == (pytest.approx(2.0), pytest.approx(12.0))


def test_the_noise_floor_is_the_fixed_path_s_two_processes_one_over_the_other_per_round(tmp_path: Path):
    calls = timeline([100.0] * 3)
    assert twins(calls) is None  # one fixed process
    speeds = {3: [100.0, 90.0, 100.0], 4: [100.0, 100.0, 125.0]}  # process -> its tokens/s per round
    calls += [Call("fixed", p, 10 + r, 0, 1, v, SPANS[2], 2, 0) for p, vs in speeds.items() for r, v in enumerate(vs)]
    calls += [Call("fixed", 4, 13, 0, 1, 50.0, SPANS[2], 2, 0)]  # a round without process 3's call
    floor = twins([c for c in calls if c.process in (3, 4)])
    assert (floor.median, floor.lowest, floor.rounds) == (pytest.approx(0.9), pytest.approx(0.8), 3)
    row = row_of(calls)
    text = report([row], tmp_path)
    # processes 1 (the timeline's fixed one) and 3, in the rounds they share: 100/100, 100/90, 100/100
    assert "| reference; its first process over its second: no round with both / no round with both / 1.00 (0.90) |" \
        in text


def test_processes_are_one_per_side_and_the_rest_alternately_default_and_fixed():
    assert assigned(["default", "fixed", "sample.py", "server"], 6) == [
        "default", "fixed", "sample.py", "server", "default", "fixed"]
    assert assigned(["fixed", "server"], 3) == ["fixed", "server", "fixed"]
    with pytest.raises(SettingsError, match="--processes 3 cannot start one process for each of the 4 sides"):
        Settings(sides=["default", "fixed", "sample.py", "server"], processes=3)
    with pytest.raises(SettingsError, match="must include fixed"):
        Settings(sides=["default", "server"])


def test_one_core_pins_what_it_starts_to_one_core_and_gives_the_others_back():
    before = os.sched_getaffinity(0)
    with pinned("one-core"):
        assert os.sched_getaffinity(0) == {min(before)}
    assert os.sched_getaffinity(0) == before
    with pinned("quiet"):
        assert os.sched_getaffinity(0) == before


def row_of(calls: list[Call], load=(10.0, 20.0)):
    return summarize("quiet", "fp32", 1, ["default", "fixed"], {"default": [3.0], "fixed": [2.5]}, calls, list(load),
                     RATES)


def report(rows, tmp_path: Path, not_measured=None) -> str:
    page = Page(tmp_path / "REPORT.md")
    section(UserStart("gpt2", 4, 10.0, 128, 32, not_measured or {}, rows, "python -m bench.experiments user_start",
                      environment(torch.device("cpu"))), page)
    return page.text()


def test_rows_say_which_path_they_timed_and_that_the_warm_ups_overlapped(tmp_path: Path):
    row = row_of(timeline([100.0] * 5))
    assert row.over_fixed[SPANS[0]]["default"].median == pytest.approx(1.0)
    assert row.tokens_per_s[SPANS[1]]["fixed"] == 50.0
    text = report([row], tmp_path)
    for side in ("default", "fixed"):
        assert f"| {LABELS[side]} | overlapped (1 of 2 processes) |" in text


def test_a_span_without_rounds_and_a_side_not_measured_say_why_and_never_nan(tmp_path: Path):
    # the first span's calls outlasted the rest: the busy loop started and stopped at once, after them
    row = row_of(timeline([], spans=SPANS[:1]), load=(60.0, 60.0))
    assert row.over_fixed[SPANS[1]]["default"] is None and row.recovery["default"] is None
    text = report([row], tmp_path, {"ORT": "onnxruntime not importable in python"})
    assert "nan" not in text.lower()
    assert "| 1.00 (1.00) / no round / no round |" in text
    assert "| no ORT side (see above) |" in text
    assert "| no round after the load |" in text
    assert "no round after the load" in report([row_of(timeline([], spans=SPANS[:2]))], tmp_path)
    assert "| 1.0 own, 1.0 wall |" in report([row_of(timeline([100.0] * 3))], tmp_path)
    assert "**ORT was not measured**: onnxruntime not importable in python." in text


def test_sample_py_a_server_client_and_ort_run_as_users_start_them(tmp_path: Path, monkeypatch):
    """The tiny model, two rows per call, a second per span: every side starts, warms up with the others and is
    timed in each span; ONNX Runtime is measured where it imports and said not to be where it does not."""
    settings = Settings(model="tiny", sides=["fixed", "sample.py", "server", "ORT"], processes=4, conditions=["quiet"],
                        precisions=["int8"], batch_sizes=[2], span_s=1.0, first_tokens=2, new_tokens=2,
                        prompt_tokens=8)
    monkeypatch.setattr(user_start, "measure_in_process", lambda threads, cores: RATES)  # seconds of a 1 GiB read
    result = user_start.measure(settings, tmp_path)
    (row,) = result.rows
    ort = user_start.ort_missing() is None
    assert list(row.processes) == ["fixed", "sample.py", "server", *(["ORT"] if ort else [])]
    assert ("ORT" in result.not_measured) != ort
    assert all(len(row.warm_up_s[side]) == count for side, count in row.processes.items())
    for call in row.calls:
        assert call.tokens_per_s > 0
    for side in row.processes:
        assert any(c.side == side for c in row.calls)
    text = report(result.rows, tmp_path, result.not_measured)
    assert LABELS["sample.py"] in text and LABELS["server"] in text and "nan" not in text.lower()
