"""Every speed table in bench/REPORT.md says which path it timed (the user's default or a fixed mode) and whether the
warm-ups overlapped (issue 70): each speed experiment's section, rendered from the committed results."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.experiments import find
from bench.record import RESULTS_DIR
from bench.report_page import Page, decode_path

SPEED = ("batch_sweep", "data_prep", "data_loading", "phase_profile", "precision_memory", "comm_strategies",
         "tp_vs_fsdp", "train_speed", "generate_speed", "serve_speed", "prune_speed", "speculative", "one_off_decode",
         "playground", "first_request", "prefix_cache", "user_start")


@pytest.mark.parametrize("name", SPEED)
def test_a_speed_section_says_the_path_it_timed_and_whether_warm_ups_overlapped(name: str, tmp_path: Path):
    experiment = find(name)
    result = experiment.read(RESULTS_DIR)
    if result is None:
        pytest.skip(f"no committed {name}.json")
    page = Page(tmp_path / "REPORT.md")
    experiment.section(result, page)
    text = page.text().lower()
    assert "path timed" in text and "warm-ups" in text


def test_the_default_decode_is_named_as_the_user_s_and_any_other_as_fixed():
    assert decode_path("auto") == "the user's default (decode `auto`)"
    assert decode_path("traced") == "fixed: decode `traced`"
