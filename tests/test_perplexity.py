"""bench/eval/perplexity.py: both protocols score every token once, against a hand-computed case and transformers."""
import math

import numpy as np
import pytest
import torch

from bench.eval.perplexity import PerplexityConfig, main, run, score
from data.loader import sliding_windows


def brute_force_nll(model, tokens, context: int, stride: int) -> float:
    """Each target p scored alone: the window that owns it (the first whose targets reach p), its input
    from that window's start up to p."""
    total = 0.0
    for p in range(1, len(tokens)):
        first_target = 1 + ((p - 1) // stride) * stride
        end = min(first_target + stride, len(tokens))
        start = max(0, end - 1 - context)
        logits, _ = model(torch.tensor(tokens[start:p], dtype=torch.long)[None])
        total -= torch.log_softmax(logits[0, -1].double(), -1)[int(tokens[p])].item()
    return total


@pytest.mark.parametrize("context, stride", [(16, 16), (16, 5), (16, 1)])
def test_every_target_is_scored_once_with_its_context(small_model, context, stride):
    tokens = np.random.default_rng(0).integers(0, 50257, size=53).astype(np.uint16)
    targets = torch.cat([y.flatten() for _, y in sliding_windows(tokens, context, stride, batch_size=3)])
    assert sorted(targets[targets != -1].tolist()) == sorted(tokens[1:].astype(int).tolist())
    nll, count = score(small_model, tokens, context, stride, 3, torch.device("cpu"), "test")
    assert count == len(tokens) - 1
    assert nll == pytest.approx(brute_force_nll(small_model, tokens, context, stride), rel=1e-5)


def test_report_holds_both_protocols_with_consistent_arithmetic(tmp_path):
    from tests.conftest import save_small_artifact
    folder = save_small_artifact(tmp_path / "model")
    result = run(PerplexityConfig(checkpoint=folder, dataset="builtin", context=32, stride=8, max_tokens=400,
                                  device="cpu"))
    non_overlapping, sliding = result["protocols"]
    assert (non_overlapping["protocol"], sliding["protocol"]) == ("non-overlapping", "sliding")
    for p in (non_overlapping, sliding):
        assert p["scored_tokens"] == 399 and p["perplexity"] == pytest.approx(math.exp(p["loss"]))
        assert p["bits_per_byte"] == pytest.approx(p["loss"] * 399 / math.log(2) / result["bytes"])


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="--stride must be at least 1, got 0"):
        main(["--stride", "0"])


def test_matches_transformers_when_installed(tmp_path, small_model):
    transformers = pytest.importorskip("transformers", reason="transformers is a benchmark-only dependency")
    from storage.export import export_hf_gpt2
    export_hf_gpt2(small_model, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    tokens = np.random.default_rng(1).integers(0, 50257, size=40).astype(np.uint16)
    # transformers' guide, non-overlapping: one window, the model shifts the labels itself.
    ids = torch.tensor(tokens.astype(np.int64))[None]
    with torch.no_grad():
        hf_loss = hf(ids, labels=ids).loss.item()
    nll, count = score(small_model, tokens, 64, 64, 4, torch.device("cpu"), "test")
    assert nll / count == pytest.approx(hf_loss, rel=1e-5)


def test_a_dataset_file_that_is_not_utf8_is_one_error_line(small_artifact, tmp_path):
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / "wiki.valid.raw").write_bytes(b"\xff = Gamma = \n")
    with pytest.raises(SystemExit, match=r"^error: .*wiki.valid.raw is not UTF-8: byte 0xff at offset 0 \(line 1\)"):
        main(["--checkpoint", small_artifact, "--dataset", str(tmp_path / "wt"), "--device", "cpu"])


def test_default_stride_is_half_the_context_and_a_stride_too_large_is_explained(small_artifact, capsys):
    result = run(PerplexityConfig(checkpoint=small_artifact, dataset="builtin", max_tokens=200, device="cpu"))
    assert [(p["protocol"], p["context"], p["stride"]) for p in result["protocols"]] == [
        ("non-overlapping", 64, 64), ("sliding", 64, 32)]
    main(["--checkpoint", small_artifact, "--dataset", "builtin", "--max-tokens", "200", "--device", "cpu",
          "--stride", "64"])
    out = capsys.readouterr().out
    assert "non-overlapping" in out and "sliding skipped: --stride 64 is not below the context of 64" in out
