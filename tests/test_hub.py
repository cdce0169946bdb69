"""Pretrained GPT-2 by hub name, offline: from a hub cache the test writes in the hub's snapshot layout."""
from pathlib import Path

import pytest
import torch

from storage.artifact import load_model
from storage.export import export_hf_gpt2
from storage.hub import looks_local, resolve_checkpoint
from storage.weights import ArtifactError



def write_hub_cache(cache: Path, repo_id: str, model) -> Path:
    """models--org--name/{refs/main, snapshots/<commit>/{config.json, model.safetensors}}, as the hub client keeps it."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    export_hf_gpt2(model, snapshot)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_hub_name_loads_from_the_cache_in_every_tool(offline_hub, small_model, tmp_path):
    snapshot = write_hub_cache(offline_hub, "tiny-org/tiny-gpt2", small_model)
    assert resolve_checkpoint("tiny-org/tiny-gpt2") == snapshot
    loaded, meta = load_model("tiny-org/tiny-gpt2")
    idx = torch.randint(0, 50257, (1, 8))
    torch.testing.assert_close(loaded(idx)[0], small_model(idx)[0])
    from tests.test_sample import run_sample
    result = run_sample("--checkpoint", "tiny-org/tiny-gpt2", "--prompt", "Hello", "--max-new-tokens", "3")
    assert result.returncode == 0 and "Hello" in result.stdout, result.stderr

    import train
    out = tmp_path / "finetune"
    train.train(train.TrainConfig(init_from="tiny-org/tiny-gpt2", device="cpu", dataset="builtin", block_size=32,
                                  batch_size=2, max_steps=1, eval_batches=1, final_eval_batches=1, curves=False,
                                  out_dir=str(out)))
    assert load_model(out)[1].produced_by.source == "tiny-org/tiny-gpt2"


def test_an_uncached_name_offline_says_how_to_get_the_files(offline_hub):
    with pytest.raises(ArtifactError, match=r"gpt2-medium: the files of openai-community/gpt2-medium \(nor under "
                                            r"gpt2-medium\) .* snapshot_download"):
        resolve_checkpoint("gpt2-medium")


def test_a_bare_gpt2_name_is_found_where_from_pretrained_cached_it(offline_hub, small_model, tmp_path):
    legacy = write_hub_cache(offline_hub, "gpt2", small_model)  # models--gpt2, as from_pretrained("gpt2") keeps it
    assert resolve_checkpoint("gpt2") == legacy
    canonical = write_hub_cache(offline_hub, "openai-community/gpt2", small_model)
    assert resolve_checkpoint("gpt2") == canonical  # the canonical name first


def test_a_local_folder_wins_over_a_hub_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").mkdir()
    assert resolve_checkpoint("gpt2") == Path("gpt2")


@pytest.mark.parametrize("name, local", [
    ("out/train", True),  # out/ is there
    ("./train", True), ("/abs/train", True), ("~/train", True), ("..\\train", True), ("a/b/c", True),
    ("owner/name", False), ("gpt2", False), ("nothing-here", False),
])
def test_a_name_looks_local_when_it_reads_as_a_path(tmp_path, monkeypatch, name, local):
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    assert looks_local(name) is local


def test_a_missing_local_folder_is_no_such_folder_and_never_a_download(tmp_path, monkeypatch):
    """Issue 42: `--checkpoint out/train` where out/train did not exist advised snapshot_download('out/train')."""
    for name in ("train-int8", "prune"):
        (tmp_path / "out" / name).mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("the hub was asked"))
    hub_names = "(a hub name is gpt2, gpt2-medium, gpt2-large, gpt2-xl or a bare owner/name)"
    for name, message in [
        ("out/train", "no such folder: out/train; did you mean out/train-int8? "),
        ("./out/prun", "no such folder: ./out/prun; did you mean out/prune? "),
        ("out/x/y", "no such folder: out/x/y; out holds prune, train-int8 "),
        ("gtp2", "no such folder: gtp2; did you mean gpt2? "),
        ("nope/a/b", "no such folder: nope/a/b; the working directory holds out "),
    ]:
        with pytest.raises(ArtifactError) as refused:
            resolve_checkpoint(name, "--checkpoint")
        assert str(refused.value) == f"--checkpoint: {message}{hub_names}"
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ArtifactError, match=r"^--draft: file.txt is a file; a model is a folder holding config.json "
                                            r"and model.safetensors$"):
        resolve_checkpoint("file.txt", "--draft")
