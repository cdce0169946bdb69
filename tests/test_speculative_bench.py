"""bench/experiments/speculative.py without its training runs: the interleaved timing on small models, the
reuse of a model folder made by the same command, and the report's table and plot."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from bench.experiment import ExperimentError
from bench.experiments.speculative import (COMMAND_RECORD, TARGET, ModelRecord, SpeculativeSpeed, make_model,
                                           plot, section, time_batch)
from bench.draft_server_comparison import ServerComparison, ServerLevel, compare_servers
from bench.report_page import Page
from model.gpt import GPT
from decode.sampling import SamplingParams
from prune.structured import select_units, shrink
from runtime.timing import Spread, environment
from tests.conftest import save_small_artifact, small_config


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
    rate = Spread.of([100.0, 110.0])
    server = ServerComparison("itself", 4, 12, 2, [ServerLevel(4, "sampled", rate, rate, 1.0, 90.0, 95.0, 0.5)])
    result = SpeculativeSpeed(record(TARGET), [record("row 50%"), record("itself")], 5, 12, 2, [batch, sampled],
                              server, environment(torch.device("cpu")))
    page = Page(tmp_path / "REPORT.md")
    section(result, page)
    text = "\n".join(page.parts)
    assert "| row 50% |" in text and "the target's own" in text and "DIFFERENT" not in text
    assert "sampling at temperature 1 (seeded)" in text and "| sampled |" in text
    assert "`python -m serve --draft` (itself, K = 4)" in text
    assert "| 4 | sampled | 105.0 | 105.0 | 1.00x | 50.0% | 90 / 95 |" in text
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


def test_the_server_comparison_times_both_servers_and_reads_the_drafts_acceptance(tmp_path):
    # The target as its own draft keeps every proposal, greedy or sampled (p = q), but for the one past the 8th
    # token: of a request's steps of 2 proposals, 2 + 1, 2 + 1 and 1 of the last 2 reach it (5 of 6).
    checkpoint = save_small_artifact(tmp_path / "artifact", block_size=256)
    result = compare_servers(Path(checkpoint), "itself", Path(checkpoint), 2, [2], 8, 1, tmp_path)
    assert [(lv.clients, lv.decoding) for lv in result.levels] == [(2, "greedy"), (2, "sampled")]
    for lv in result.levels:
        assert lv.acceptance_rate == 5 / 6 and lv.speedup > 0 and lv.alone_latency_ms > 0
        assert lv.alone_tokens_per_s.n == lv.speculative_tokens_per_s.n == 1
    assert (tmp_path / "server_speculative.log").exists()
