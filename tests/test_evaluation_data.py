"""One rule for the data a tool measures a checkpoint on (storage/run_folder.py): its own training dataset and
block size, followed from an int8 or pruned artifact to the checkpoint it was made from; else the tool's default,
said so."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.eval.perplexity import PerplexityConfig, run
from runtime.provenance import provenance
from storage.meta import CONFIG_FILE
from storage.run_folder import evaluation_context, evaluation_dataset, trained_on
from storage.training_state import STATE_FILE, TrainingState
from tests.conftest import save_small_artifact

NOTES = "".join(f"Line {i} of my own notes, about lamps and ropes.\n\n" for i in range(600))


def training_checkpoint(folder: Path, dataset: str, block_size: int | None) -> Path:
    """A small artifact with the training state train.py would have written beside it."""
    save_small_artifact(folder)
    (folder / "training_state").mkdir()
    TrainingState(step=1, sampler={}, global_batch=2, train_config={"dataset": dataset, "block_size": block_size},
                  torch_rng=[0]).write(folder / STATE_FILE)
    return folder


def made_from(folder: Path, source: Path, tool: str, **extra) -> Path:
    """An artifact (as quantize/ or prune/ writes one) whose provenance names `source`."""
    save_small_artifact(folder)
    meta = json.loads((folder / CONFIG_FILE).read_text())
    meta.update(produced_by=provenance(tool, source), **extra)
    (folder / CONFIG_FILE).write_text(json.dumps(meta))
    return folder


def test_a_training_checkpoint_names_its_dataset_and_block_size(tmp_path):
    train = training_checkpoint(tmp_path / "train", "my-corpus", 32)
    assert trained_on(train).dataset == "my-corpus" and trained_on(train).block_size == 32
    assert evaluation_dataset(None, train, "builtin") == (
        "my-corpus", f"the checkpoint's training dataset, recorded in {train / STATE_FILE}")
    assert evaluation_dataset("wikitext-2", train, "builtin") == ("wikitext-2", "from --dataset")


def test_an_int8_or_pruned_artifact_is_followed_to_its_source(tmp_path):
    train = training_checkpoint(tmp_path / "train", "my-corpus", 32)
    pruned = made_from(tmp_path / "pruned", train, "prune/iterative.py", artifact="pruned",
                       pruning={"dataset": "pruning-corpus"})
    int8 = made_from(tmp_path / "int8", pruned, "quantize/dynamic.py")
    assert trained_on(int8).dataset == "pruning-corpus"  # last fine-tuned on it while pruned
    assert trained_on(int8).dataset_record == pruned / CONFIG_FILE
    assert trained_on(int8).block_size == 32 and trained_on(int8).block_record == train / STATE_FILE


def test_an_artifact_that_records_no_training_falls_back_and_says_so(tmp_path):
    loop = made_from(tmp_path / "loop", tmp_path / "loop", "quantize/dynamic.py")  # its own source: no endless walk
    gone = made_from(tmp_path / "gone", tmp_path / "moved-away", "quantize/dynamic.py")
    for folder in (loop, gone):
        assert evaluation_dataset(None, folder, "wikitext-103") == (
            "wikitext-103", f"the default: {folder} records no training dataset; pass --dataset if it was trained "
                            f"on another")
        assert evaluation_context(None, "--context", folder, 64) == (64, None)


def test_the_context_defaults_to_the_trained_block_and_warns_beyond_it(tmp_path):
    train = training_checkpoint(tmp_path / "train", "my-corpus", 32)
    assert evaluation_context(None, "--context", train, 64) == (32, None)
    assert evaluation_context(16, "--context", train, 64) == (16, None)
    assert evaluation_context(48, "--context", train, 64) == (48, (
        f"warning: --context 48 reaches positions the model was never trained at: it was trained with --block-size "
        f"32 (recorded in {train / STATE_FILE}); positions past 32 score worse"))
    whole = training_checkpoint(tmp_path / "whole", "my-corpus", None)  # trained on the model's whole context
    assert evaluation_context(None, "--context", whole, 64) == (64, None)


def test_perplexity_measures_on_the_checkpoints_own_data_and_context(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPT2_DATA_CACHE", str(tmp_path / "cache"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text(NOTES)
    train = training_checkpoint(tmp_path / "train", str(tmp_path / "notes"), 32)
    result = run(PerplexityConfig(checkpoint=str(train), max_tokens=100, device="cpu"))
    assert result["dataset"] == str(tmp_path / "notes") and result["protocols"][0]["context"] == 32
    assert result["dataset_chosen"] == f"the checkpoint's training dataset, recorded in {train / STATE_FILE}"
    first = capsys.readouterr().err.splitlines()[0]
    assert first == f"model: {train} (--checkpoint); dataset: {tmp_path / 'notes'} ({result['dataset_chosen']})"


@pytest.mark.parametrize("tool", ["bench/eval/perplexity.py", "quantize/dynamic.py", "bench/leaderboard.py"])
def test_the_tools_help_says_the_dataset_defaults_to_the_checkpoints(tool, capsys):
    import importlib
    module = importlib.import_module(tool.removesuffix(".py").replace("/", "."))
    with pytest.raises(SystemExit):
        module.main(["--help"])
    assert "(default: the checkpoint's training dataset, else" in " ".join(capsys.readouterr().out.split())
