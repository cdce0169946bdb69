"""bench/experiments/speculative.py without its training runs: the interleaved timing on small models, the
reuse of a model folder made by the same command, and the report's table and plot."""
from __future__ import annotations

import sys

import pytest
import torch

from bench.experiment import ExperimentError
from bench.experiments.speculative import (COMMAND_RECORD, TARGET, ModelRecord, SpeculativeSpeed, make_model,
                                           plot, section, time_batch)
from bench.report_page import Page
from model.gpt import GPT
from model.sampling import SamplingParams
from prune.structured import select_units, shrink
from runtime.timing import environment
from tests.conftest import small_config


def test_time_batch_compares_every_draft_and_k_with_the_target_alone(tmp_path):
    torch.manual_seed(0)
    target = GPT(small_config()).eval()
    models = {TARGET: target, "row 50%": shrink(target, *select_units(target, 0.5, target.config)).eval(),
              "itself": target}
    prompts = torch.randint(0, 50000, (3, 2, 5), generator=torch.Generator().manual_seed(0))  # 2 timed rounds
    params = SamplingParams(max_new_tokens=12, temperature=0, stop_at_eot=False)
    batch = time_batch(target, models, ["row 50%", "itself"], prompts, params, [1, 3])
    assert batch.batch_size == 2 and batch.target_tokens_per_s.n == 2
    assert [(v.draft, v.draft_tokens) for v in batch.variants] == [("row 50%", 1), ("row 50%", 3), ("itself", 1),
                                                                  ("itself", 3)]
    assert all(v.identical_tokens and v.speedup > 0 and v.tokens_per_s.n == 2 for v in batch.variants)
    itself = [v for v in batch.variants if v.draft == "itself"]
    assert [(v.acceptance_rate, v.tokens_per_target_pass) for v in itself] == [(1.0, 2.0), (1.0, 4.0)]
    assert set(batch.draft_cost) == {"row 50%", "itself"} and all(c > 0 for c in batch.draft_cost.values())
    assert batch.temperature == 0 and batch.target_text

    sampled = time_batch(target, models, ["row 50%", "itself"], prompts,
                         SamplingParams(max_new_tokens=12, seed=0, stop_at_eot=False), [2])
    assert [v.identical_tokens for v in sampled.variants] == [None, None] and sampled.variants[1].acceptance_rate == 1

    record = lambda name: ModelRecord(name, f"out/{name}", 1000, f"train.py --name {name}")
    result = SpeculativeSpeed(record(TARGET), [record("row 50%"), record("itself")], 5, 12, 2, [batch, sampled],
                              environment(torch.device("cpu")))
    page = Page(tmp_path / "REPORT.md")
    section(result, page)
    text = "\n".join(page.parts)
    assert "| row 50% |" in text and "the target's own" in text and "DIFFERENT" not in text
    assert "sampling at temperature 1 (seeded)" in text and "| sampled |" in text
    plot(result)


def test_a_model_folder_is_reused_only_for_the_same_command(tmp_path):
    folder = tmp_path / "model"
    write = [sys.executable, "-c", f"import pathlib; pathlib.Path({str(folder)!r}).mkdir(exist_ok=True); "
                                   f"(pathlib.Path({str(folder)!r}) / 'config.json').write_text('{{}}')"]
    make_model(folder, write, ["--steps", "1"])
    (folder / "config.json").write_text("made first")
    make_model(folder, write, ["--steps", "1"])  # the same command: kept
    assert (folder / "config.json").read_text() == "made first"
    make_model(folder, write, ["--steps", "2"])  # another: made again
    assert (folder / "config.json").read_text() == "{}"
    assert (folder / COMMAND_RECORD).read_text() == '["--steps", "2"]'
    (folder / "config.json").write_text("made second")
    (folder / COMMAND_RECORD).write_text('["--steps", "2"')  # a damaged record: made again, not an error
    make_model(folder, write, ["--steps", "2"])
    assert (folder / "config.json").read_text() == "{}"
    with pytest.raises(ExperimentError, match="making .*model failed"):
        make_model(folder, [sys.executable, "-c", "raise SystemExit(3)"], ["--steps", "3"])
