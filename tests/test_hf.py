import json

import pytest
import torch
from safetensors.torch import load_file

from model.gpt import GPT
from storage.artifact import load_model
from storage.export import export_hf_gpt2
from storage.hf import hf_to_ours, ours_to_hf
from tests.conftest import small_config


def test_export_writes_hugging_face_layout(tmp_path, small_model):
    export_hf_gpt2(small_model, tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    c = small_model.config
    # Conv1D weights are (in, out); the vocabulary is unpadded; no duplicated head.
    assert state["h.0.attn.c_attn.weight"].shape == (c.n_embd, 3 * c.n_embd)
    assert state["h.1.mlp.c_proj.weight"].shape == (4 * c.n_embd, c.n_embd)
    assert state["wte.weight"].shape == (50257, c.n_embd)
    assert "lm_head.weight" not in state
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gpt2"


def test_round_trip_through_hugging_face_format_is_exact(tmp_path, small_model):
    export_hf_gpt2(small_model, tmp_path)
    loaded, meta = load_model(tmp_path)
    idx = torch.randint(0, 50257, (2, 12))
    assert torch.equal(small_model(idx)[0], loaded(idx)[0])
    assert meta.produced_by.tool == "huggingface"


def test_key_mapping_is_inverse_up_to_vocabulary_padding():
    model = GPT(small_config())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    back = hf_to_ours(ours_to_hf(state, model.config), model.config)
    # Export drops the padded embedding rows; import pads them back with zeros.
    assert torch.equal(back["transformer.wte.weight"][50257:], torch.zeros(47, 32))
    state["transformer.wte.weight"][50257:] = 0
    assert set(back) == set(state) - {"lm_head.weight"}
    for key, value in back.items():
        assert torch.equal(value, state[key]), key


def test_logits_match_transformers_when_installed(tmp_path, small_model):
    transformers = pytest.importorskip("transformers", reason="transformers is a benchmark-only dependency")
    export_hf_gpt2(small_model, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    idx = torch.randint(0, 50257, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, small_model(idx)[0], atol=1e-4, rtol=1e-4)


def test_non_gpt2_folder_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="only GPT-2 is supported"):
        load_model(tmp_path)


def test_pruned_model_cannot_be_exported(tmp_path):
    model = GPT(small_config(mlp_hidden=[64, 128]))
    with pytest.raises(ValueError, match="row-pruned"):
        export_hf_gpt2(model, tmp_path)
