"""runtime/progress.py: a progress bar in a log file or a pipe is whole lines, one per few percent."""
from __future__ import annotations

import io
import time

import pytest

from runtime.progress import LINE_PERCENT, Heartbeat, ProgressBar
from runtime.timing import MIN_NOISE_FLOOR, noise_floor, ratio_beside_floor


def test_a_bar_not_on_a_terminal_writes_a_line_per_few_percent_and_no_carriage_returns():
    log = io.StringIO()
    with ProgressBar(total=1000, desc="validation", file=log, mininterval=0) as bar:
        for _ in range(1000):
            bar.update()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 100 // LINE_PERCENT + 1  # 0%, 5%, ..., 100%
    assert lines[0].startswith("validation:   0%") and lines[-1].startswith("validation: 100%")


def test_a_bar_that_does_not_stay_leaves_only_its_progress_lines():
    log = io.StringIO()
    for _ in ProgressBar(range(10), desc="scoring", file=log, leave=False, mininterval=0):
        pass
    lines = log.getvalue().split("\n")
    assert lines[-1] == "" and len(lines[:-1]) == 11 and all(line.startswith("scoring: ") for line in lines[:-1])


def test_a_bar_without_a_total_writes_its_first_line_and_its_last():
    log = io.StringIO()
    with ProgressBar(desc="tokenizing", file=log, mininterval=0) as bar:
        bar.update(7)
    assert [line.split(" [")[0] for line in log.getvalue().splitlines()] == ["tokenizing: 0it", "tokenizing: 7it"]


def test_a_ratio_within_the_noise_floor_reads_no_measurable_change_and_one_beyond_it_sits_beside_the_floor():
    assert ratio_beside_floor(1.19, 0.25) == "no measurable change (+-25% noise floor)"
    assert ratio_beside_floor(0.80, 0.25) == "no measurable change (+-25% noise floor)"
    assert ratio_beside_floor(1.45, 0.25) == "1.45x (noise floor +-25%)"
    assert ratio_beside_floor(0.5, 0.06) == "0.50x (noise floor +-6%)"


def test_the_noise_floor_is_how_far_a_model_against_itself_strays_from_1_and_never_below_the_minimum():
    assert noise_floor(0.94, 1.02) == pytest.approx(0.06)
    assert noise_floor(1.0) == MIN_NOISE_FLOOR
    assert noise_floor(1.3, 0.9) == pytest.approx(0.3)


def test_a_heartbeat_writes_what_the_tool_does_and_the_time_left_whenever_it_has_been_silent():
    out = io.StringIO()
    with Heartbeat("prune", file=out, every=0.05) as beat:
        beat.phase("round 1/4: fine-tune")
        beat.expect(3600, "estimate: about 1 h for the whole run")
        time.sleep(1.5)  # the thread looks once a second
    lines = out.getvalue().splitlines()
    assert lines[0] == "estimate: about 1 h for the whole run"
    assert len(lines) >= 2 and all(line.startswith("prune: round 1/4: fine-tune; ") and "min left" in line
                                   for line in lines[1:]), lines


def test_a_heartbeat_says_nothing_while_the_tool_speaks_often_enough():
    out = io.StringIO()
    with Heartbeat("quantize", file=out, every=60) as beat:
        beat.say("first")
        time.sleep(1.2)
    assert out.getvalue() == "first\n"
