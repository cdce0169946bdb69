"""python -m storage.export: a folder transformers loads; artifacts it cannot represent are refused with the reason."""
import json

import pytest
import torch

from runtime.provenance import provenance
from storage.artifact import load_model, save_artifact
from storage.export import main
from tests.conftest import save_small_artifact, small_config


def test_export_round_trips_and_loads_in_transformers_when_installed(tmp_path):
    folder = save_small_artifact(tmp_path / "float")
    main(["--checkpoint", folder, "--out", str(tmp_path / "hf")])
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "gpt2"
    ours, _ = load_model(folder)
    back, _ = load_model(tmp_path / "hf")  # the project's own loader reads Hugging Face folders too
    idx = torch.randint(0, 50257, (2, 10))
    assert torch.equal(ours(idx)[0], back(idx)[0])
    try:
        import transformers
    except ImportError:
        return  # a benchmark-only dependency; the round trip above still ran
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, ours(idx)[0], atol=1e-4, rtol=1e-4)


def test_row_pruned_and_int8_artifacts_are_refused_with_the_reason(tmp_path):
    from model.gpt import GPT
    pruned = GPT(small_config(mlp_hidden=[64, 128]))
    save_artifact(tmp_path / "rows", pruned, pruned.config, "pruned", provenance("tests"))
    with pytest.raises(SystemExit, match="row-pruned: its per-layer widths"):
        main(["--checkpoint", str(tmp_path / "rows"), "--out", str(tmp_path / "hf")])
    (tmp_path / "q").mkdir()
    from quantize.dynamic import main as quantize_main
    quantize_main(["--checkpoint", save_small_artifact(tmp_path / "f"), "--out-dir", str(tmp_path / "q"),
                   "--eval-batches", "1", "--repeats", "1", "--new-tokens", "2", "--dataset", "builtin"])
    with pytest.raises(SystemExit, match="int8 artifact; transformers' GPT-2 has no int8 layers"):
        main(["--checkpoint", str(tmp_path / "q"), "--out", str(tmp_path / "hf")])
