"""bench/experiments/user_start.py's summary of a timeline: paired default/fixed ratios per span, the time to recover
after the load, and rows that say which path they timed and that the warm-ups overlapped."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.experiments.user_start import LABELS, SPANS, Call, Settings, UserStart, paired, recovery, section, summarize
from bench.peers.host_rates import HostRates
from bench.report_page import Page
from runtime.timing import environment


def timeline(default_after: list[float]) -> list[Call]:
    """Calls in turns, a second each: the fixed path at 100 tokens/s throughout (50 under load), the default at 100
    before the load, 50 under it, then `default_after` one call at a time."""
    calls, now = [], 0.0

    def call(path, speed, span):
        nonlocal now
        calls.append(Call(path, 0 if path == "default" else 1, now, now + 1.0, speed, span, 2, 0.5))
        now += 1.0
    for _ in range(5):
        call("default", 100.0, SPANS[0])
        call("fixed", 100.0, SPANS[0])
    for _ in range(5):
        call("fixed", 50.0, SPANS[1])
        call("default", 50.0, SPANS[1])
    for speed in default_after:
        call("default", speed, SPANS[2])
        call("fixed", 100.0, SPANS[2])
    return calls


def test_each_default_call_is_paired_with_the_fixed_call_beside_it():
    assert paired(timeline([60.0])[-2:]) == [pytest.approx(0.6)]


def test_recovery_is_from_the_load_s_end_to_the_end_of_the_first_default_call_back_within_five_percent():
    calls = timeline([60.0, 80.0, 96.0, 99.0, 100.0])
    load_end = 20.0
    assert recovery(calls, load_end) == pytest.approx(6.0 - 1.0)  # the third default call after it (ends at 25 s)
    assert recovery(timeline([60.0, 70.0]), load_end) is None  # never back within the span


def test_rows_say_which_path_they_timed_and_that_the_warm_ups_overlapped(tmp_path: Path):
    settings = Settings(span_s=10.0)
    rates = HostRates(30.0, 120.0, 2, [0, 1])
    row = summarize("fp32", 1, {"default": [3.0], "fixed": [2.5]}, timeline([100.0] * 5), settings, rates)
    assert row.default_over_fixed[SPANS[0]] == pytest.approx(1.0) and row.tokens_per_s[SPANS[1]]["fixed"] == 50.0
    page = Page(tmp_path / "REPORT.md")
    section(UserStart("gpt2", 4, 10.0, 32, [row], "python -m bench.experiments user_start",
                      environment(torch.device("cpu"))), page)
    text = page.text()
    for label in LABELS.values():
        assert f"| {label} | overlapped (4) |" in text
