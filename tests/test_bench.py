"""bench/: the scorecard's five keys with numbers and units; every experiment script in a tiny
configuration (train.py and torchrun really run); out-of-memory caught and reported as the limit;
the report holds every section."""
from __future__ import annotations

import json

import pytest
import torch

from bench import (batch_sweep, comm_strategies, compression, data_loading, leaderboard, phase_profile,
                   precision_memory, report, tp_vs_fsdp)
from bench.runner import flags
from model.gpt import GPT
from runtime.device import is_out_of_memory

FIVE_KEYS = ("loss", "inference_latency_1", "inference_latency_12", "training_throughput_4", "training_throughput_12")
TEXT = ("The quick brown fox jumps over the lazy dog while the committee debates the budget for the new "
        "railway station, which was opened in 1887 and rebuilt after the war. ") * 30


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every experiment once, tiny, into one results folder (the report test reads them all)."""
    root = tmp_path_factory.mktemp("bench")
    results_dir = root / "results"
    torch.manual_seed(0)
    from model.artifact import save_artifact
    from runtime.provenance import provenance
    from tests.conftest import small_config
    model = GPT(small_config())
    save_artifact(root / "artifact", model, model.config, "float", provenance("tests"))
    (root / "eval.txt").write_text(TEXT)
    out = {"root": root, "dir": results_dir}
    out["score"] = leaderboard.main(["--checkpoint", str(root / "artifact"), "--eval-text", str(root / "eval.txt"),
                                     "--new-tokens", "4", "--repeats", "1", "--block-size", "16", "--train-steps", "1",
                                     "--device", "cpu", "--out", str(results_dir / "leaderboard.json")])
    res = ["--results-dir", str(results_dir)]
    out["data_loading"] = data_loading.main(["--block-size", "16", "--batch-size", "2", "--batches", "3",
                                             "--repeats", "1", "--max-workers", "1", *res])
    out["phase_profile"] = phase_profile.main(["--block-size", "16", "--batch-size", "2", "--steps", "2",
                                               "--eval-interval", "1", "--eval-batches", "1", "--profile-steps", "1",
                                               "--device", "cpu", *res])
    out["precision_memory"] = precision_memory.main(["--precisions", "fp32", "--device", "cpu", "--block-size", "16",
                                                     "--batch-size", "2", "--steps", "3", "--work-dir", str(root / "pm"),
                                                     *res])
    # Several ranks on one machine run on the CPU (gloo) even where a GPU is present.
    tiny_parallel = ["--device", "cpu", "--block-size", "16", "--steps-per-window", "1", "--windows", "1", "--work-dir",
                     str(root / "par"), *res]
    out["comm_strategies"] = comm_strategies.main(["--modes", "allreduce", "--world-sizes", "1", "2",
                                                   "--global-batch", "2", *tiny_parallel])
    out["tp_vs_fsdp"] = tp_vs_fsdp.main(["--global-batches", "2", *tiny_parallel])
    out["compression"] = compression.main([
        "--checkpoint", str(root / "artifact"), "--methods", "magnitude", "--rounds", "1", "--finetune-steps", "1",
        "--batch-size", "2", "--block-size", "16", "--eval-batches", "1", "--speed-repeats", "1", "--new-tokens", "4",
        "--speed-seq-len", "16", "--work-dir", str(root / "compression"), *res])
    return out


def test_scorecard_has_the_five_keys_with_numbers_and_units(results):
    score = results["score"]
    for key in FIVE_KEYS:
        assert isinstance(score[key], float) and score[key] > 0, key
        assert score["units"][key] and score["definitions"][key]
        assert score["spread"].get(key, {"median": score[key]})["median"] == score[key]
    assert "tokens per second" in score["units"]["inference_latency_1"]
    assert score["loss"] > 5  # an untrained model on English text: close to ln(vocab) ~ 10.8
    assert score["time_to_first_token_s"] > 0 and score["ms_per_token_batch_1"] > 0
    assert score["artifact"]["kind"] == "float"
    assert score["environment"]["world_size"] == 1 and score["environment"]["git_commit"]
    assert score["generation"]["new_tokens"] == 4
    assert score["evaluation"]["targets"] == score["evaluation"]["tokens"] - 1  # the whole text, every target
    assert score["protocol"]["name"] == "default" and score["protocol"]["grad_accum"] == 1
    assert json.loads((results["dir"] / "leaderboard.json").read_text())["loss"] == score["loss"]


def test_reference_protocol_needs_room_for_its_500_new_tokens(results):
    with pytest.raises(SystemExit, match="--protocol reference generates 500 new tokens .* context of 64"):
        leaderboard.main(["--checkpoint", str(results["root"] / "artifact"), "--eval-text",
                          str(results["root"] / "eval.txt"), "--protocol", "reference"])


def test_leaderboard_refuses_what_cannot_work(small_artifact, tmp_path):
    with pytest.raises(SystemExit, match="is not a file"):
        leaderboard.main(["--checkpoint", small_artifact, "--eval-text", str(tmp_path / "missing.txt")])
    (tmp_path / "t.txt").write_text(TEXT)
    with pytest.raises(SystemExit, match="exceeds the model's context of 64"):
        leaderboard.main(["--checkpoint", small_artifact, "--eval-text", str(tmp_path / "t.txt"), "--new-tokens", "60"])


def test_batch_sweep_reports_an_allocation_failure_as_the_limit(tmp_path, monkeypatch):
    forward = GPT.forward

    def failing_forward(self, idx, *args, **kwargs):
        if idx.size(0) >= 4:
            raise torch.OutOfMemoryError("forced allocation failure")
        return forward(self, idx, *args, **kwargs)

    monkeypatch.setattr(GPT, "forward", failing_forward)
    result = batch_sweep.main(["--block-size", "8", "--max-batch", "64", "--steps", "1", "--repeats", "1",
                               "--results-dir", str(tmp_path)])
    assert [r["batch_size"] for r in result["rows"]] == [1, 2]
    assert result["limit"] == {"batch_size": 4, "reason": "out of memory"}
    assert all(r["tokens_per_s"]["median"] > 0 and r["epoch_equivalent_s"] > 0 for r in result["rows"])
    assert (tmp_path / "batch_sweep.png").stat().st_size > 0
    assert json.loads((tmp_path / "batch_sweep.json").read_text())["limit"]["batch_size"] == 4


def test_cpu_allocation_failures_count_as_out_of_memory_and_nothing_else_does():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


def test_data_loading_measures_each_worker_count(results):
    rows = results["data_loading"]["rows"]
    assert [r["num_workers"] for r in rows] == [None, 0, 1]
    assert all(r["per_batch_s"]["median"] > 0 for r in rows)


def test_phase_profile_accounts_for_the_whole_time(results):
    res = results["phase_profile"]
    assert set(res["phase_s"]) == {"data", "forward", "backward", "optimizer", "evaluation", "other"}
    assert sum(res["phase_s"].values()) == pytest.approx(res["total_s"], rel=1e-6)
    assert res["phase_s"]["evaluation"] > 0 and res["phase_s"]["backward"] > 0
    assert (results["dir"] / res["profiler"]["trace"]).stat().st_size > 0 and res["profiler"]["top_ops"]


def test_precision_memory_runs_train_py_per_setting(results):
    rows = results["precision_memory"]["rows"]
    assert [(r["precision"], r["activation_checkpointing"]) for r in rows] == [("fp32", False), ("fp32", True)]
    for r in rows:
        assert r["finished"] and len(r["losses"]) == 3 and r["step_s"] > 0 and r["peak_memory_bytes"] > 0
    # Recomputing activations changes nothing numerically.
    assert rows[0]["losses"] == pytest.approx(rows[1]["losses"], rel=1e-4)


def test_communication_bytes_match_theory_and_scaling_is_relative_to_one_rank(results):
    res = results["comm_strategies"]
    one, two = res["rows"]
    assert one["sent_bytes_per_step"] == 0 and two["sent_bytes_per_step"] > 0
    assert two["sent_bytes_per_step"] == pytest.approx(two["sent_bytes_theory_per_step"], rel=1e-6)
    assert len(two["peak_memory_bytes_per_rank"]) == 2
    assert [s["speedup"] for s in res["strong_scaling"]][0] == 1.0
    assert res["strong_scaling"][1]["speedup"] == pytest.approx(
        one["iteration_s"]["median"] / two["iteration_s"]["median"])


def test_tp_and_fsdp_both_run_at_each_batch(results):
    rows = results["tp_vs_fsdp"]["rows"]
    assert [r["mode"] for r in rows] == ["tp", "fsdp"]
    assert all("error" not in r and r["tokens_per_s"]["median"] > 0 for r in rows)


def test_compression_gathers_prune_and_quantize_reports(results):
    res = results["compression"]
    assert [r["sparsity"] for r in res["pruning"]["magnitude"]["rounds"]][0] == 0.0
    assert res["pruning"]["magnitude"]["rounds"][-1]["sparsity"] == pytest.approx(0.5, abs=0.01)
    assert set(res["quantization"]["val_loss"]) == {"float", "int8", "change_pct"}
    assert res["quantization"]["size_bytes"]["int8"] > 0


def test_report_holds_every_table_and_plot(results, tmp_path):
    out = report.write_report(results["dir"], tmp_path / "REPORT.md")
    text = out.read_text()
    assert "Not run" in text  # the batch sweep of this fixture did not run, and the report says so
    for heading in ("Scorecard", "2. Data loading", "3. Phase profile", "4. Precision", "5. Communication",
                    "6. Tensor parallel", "7. Compression"):
        assert heading in text
    for image in ("data_loading.png", "phase_profile.png", "precision_memory.png", "comm_strategies.png",
                  "tp_vs_fsdp.png", "compression.png"):
        assert f"![{image}](" in text and (results["dir"] / image).exists()
    assert "CPU figures, not GPU figures" in text
    assert f"{results['score']['loss']:.4f}" in text


def test_flags_follow_train_py_conventions():
    assert flags({"batch_size": 4, "compile": True, "resume": False, "init_from": None}) == \
        ["--batch-size", "4", "--compile", "--no-resume"]
