"""bench/REPORT.md reads top-down (bench/report.py, bench/headline.py): it opens with the headline -- one row per
question from the newest result that answers it, each with its commit, the host's rates and a link that resolves --
and one plot; the studies follow, and the by-hand history is the dated appendix at the end."""
from __future__ import annotations

import json
import re
import shutil

from bench import report
from bench.experiments import EXPERIMENTS
from bench.headline import PLOT, QUESTIONS
from bench.record import RESULTS_DIR

QUESTIONS_ASKED = ("Decoding", "Serving", "Training", "int8 quality", "Pruning")


def headline_rows(text: str) -> list[str]:
    table = text[text.index("## Headline\n"):text.index("## The studies")]
    return [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| question")]


def test_the_report_opens_with_one_headline_row_per_question_and_one_plot(tmp_path):
    out = report.write_report(RESULTS_DIR, tmp_path / "REPORT.md")
    text = out.read_text()
    assert re.findall(r"^## .*", text, re.MULTILINE)[0] == "## Headline"
    rows = headline_rows(text)
    assert len(rows) == len(QUESTIONS)
    for asked, row in zip(QUESTIONS_ASKED, rows):
        question, path, ratios, rates, measured, details = row.strip("| ").split(" | ")
        assert question.startswith(asked) and path and re.search(r"\d\.\d\dx", ratios), row
        assert re.match(r"`[0-9a-f]{7,}`, ", measured) and ("load" in rates or "not recorded" in rates), row
        anchor = re.fullmatch(r"\[.+\]\(#([\w-]+)\)", details).group(1)
        assert f'<a id="{anchor}"></a>' in text, (anchor, row)  # the link lands on a section of this report
    assert f"![{PLOT}](results/{PLOT})" in text and (tmp_path / "results" / PLOT).stat().st_size > 0
    assert text.index("## Headline") < text.index("## Scorecard") < text.index("## Conditions") < \
        text.index("## Appendix: measured by hand")
    appendix = text[text.index("## Appendix: measured by hand"):]
    assert appendix.count("*First recorded 2026-") == appendix.count("\n### ")


def test_each_question_is_answered_by_the_newest_result_that_answers_it(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    for name in ("generate_speed", "serve_speed", "train_speed", "prune_speed"):
        shutil.copy(RESULTS_DIR / f"{name}.json", results)
    later = json.loads((RESULTS_DIR / "train_speed.json").read_text())
    later["environment"]["date"] = "2099-01-01T00:00:00Z"
    later["environment"]["git_commit"] = "abcdef1"
    later["shapes"][0]["ratio_ours_over_nanogpt"] = 3.21
    (results / "rerun").mkdir()
    (results / "rerun" / "train_speed.json").write_text(json.dumps(later))
    text = report.write_report(results, tmp_path / "REPORT.md").read_text()
    training = next(row for row in headline_rows(text) if row.startswith("| Training"))
    assert "3.21x" in training and "`abcdef1`, 2099-01-01" in training
    # not cited by any by-hand section: the link is the appendix's
    assert "[appendix: `rerun/train_speed.json`](#by-hand)" in training
    decoding = next(row for row in headline_rows(text) if row.startswith("| Decoding"))
    number = [e.name for e in EXPERIMENTS].index("generate_speed") + 1
    assert f"[section {number}](#generate_speed)" in decoding
    assert "Not answered by the results: no quant_report of a trained model with the int8 head." in text
