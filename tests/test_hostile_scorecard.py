"""The scorecard file `--resume` reads back (tests/hostile.py's property): whatever a hand edit, a damaged disk or
another program left at --out, `bench/leaderboard.py --resume` either finishes it or stops with one `error:` line,
and a file it refuses is byte-identical afterwards."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bench import leaderboard
from tests.conftest import save_small_artifact
from tests.hostile import attempt, examples
from tests.test_hostile_artifacts import DROP, JSON_VALUES, nested

TEXT = "The committee debates the budget for the new railway station, which opened in 1887. " * 6
# Where an edit lands: the parts --resume reads (statuses, raw measurements, settings) and the file's top.
PLACES = ("status", "status.loss", "status.loss.status", "measurements", "measurements.loss",
          "measurements.loss.val_loss", "measurements.loss.val_tokens", "measurements.loss.measured_on", "settings",
          "settings.repeats", "settings.artifact", "settings.new_key", "loss", "")


@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> tuple[list[str], Path]:
    """The command (without --out) and a scorecard file of one measured figure, its loss."""
    root = tmp_path_factory.mktemp("scored")
    (root / "eval.txt").write_text(TEXT)
    command = ["--checkpoint", save_small_artifact(root / "artifact"), "--eval-text", str(root / "eval.txt"),
               "--prompt-tokens", "4", "--new-tokens", "2", "--repeats", "1", "--device", "cpu", "--only", "loss"]
    leaderboard.main([*command, "--out", str(root / "score.json")])
    return command, root / "score.json"


def edited(score: dict, place: str, value) -> dict | list:
    """`score` with the value at `place` (dotted keys; "" the whole file) replaced by `value`, or removed (DROP)."""
    if not place:
        return value
    *parents, key = place.split(".")
    holder = score
    for part in parents:
        holder = holder[part]
    if value is DROP:
        holder.pop(key, None)
    else:
        holder[key] = value
    return score


@given(place=st.sampled_from(PLACES), value=JSON_VALUES | st.just(DROP), text=st.none() | st.text(max_size=40),
       nesting=st.none() | st.integers(1, 100_000))
@example(place="measurements.loss", value="fast", text=None, nesting=None).via("a measurement of the wrong shape")
@example(place="status.loss", value="measured", text=None, nesting=None).via("a status that is not a table")
@example(place="settings.new_key", value="a\nb", text=None, nesting=None).via("a setting the run does not have")
@example(place="", value=None, text=None, nesting=100_000).via("nesting deeper than json can read")
@examples(12)
def test_a_damaged_scorecard_file_is_finished_or_one_error_line_and_left_as_it_was(scored, tmp_path_factory, place,
                                                                                   value, text, nesting):
    command, good = scored
    out = tmp_path_factory.mktemp("resume") / "score.json"
    shutil.copy(good, out)
    if nesting is not None:
        out.write_text(nested(nesting))
    elif text is not None:
        out.write_text(text)
    else:
        out.write_text(json.dumps(edited(json.loads(good.read_text()), place, value)))
    surface = "scorecard file: --resume"
    before = out.read_bytes()
    outcome = attempt(surface, lambda: leaderboard.main([*command, "--out", str(out), "--resume"]))
    if outcome == "refused":
        assert out.read_bytes() == before, f"{surface}: a refused file was changed"
    else:
        finished = json.loads(out.read_text())
        assert finished["status"]["loss"]["status"] == "measured" and finished["loss"] > 0
