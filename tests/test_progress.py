"""runtime/progress.py: a progress bar in a log file or a pipe is whole lines, one per few percent."""
from __future__ import annotations

import io

from runtime.progress import LINE_PERCENT, ProgressBar


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
