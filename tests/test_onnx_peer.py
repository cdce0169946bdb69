"""bench/peers/onnx_peer.py: our weights converted by ONNX Runtime's GPT-2 converter decode, in ONNX Runtime with IO
binding, the tokens our generate() decodes (fp32), its optimizer fused attention, and its int8 graph really is
quantized.  Needs the optional onnxruntime, onnx and transformers 4.44 (its converter's)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")

from bench.peers.onnx_peer import OrtDecoder, ort_files
from decode.generate import generate
from model.gpt import GPT
from decode.sampling import SamplingParams
from tests.conftest import small_config


def test_onnx_runtime_decodes_our_greedy_tokens_and_its_int8_graph_is_quantized(tmp_path):
    import onnx
    torch.manual_seed(0)
    model = GPT(small_config()).eval()
    files = ort_files(model, tmp_path)
    decoder = OrtDecoder.load(files["fp32"], threads=1)
    for batch, length in ((1, 5), (3, 9)):  # batch and lengths are not fixed by the export's example
        prompts = torch.randint(0, 50257, (batch, length))
        ours = generate(model, prompts, SamplingParams(max_new_tokens=10, temperature=0, stop_at_eot=False))
        assert torch.equal(decoder.generate(prompts, 10), ours)
    fused = [node.op_type for node in onnx.load(str(files["fp32"])).graph.node]
    assert fused.count("Attention") == model.config.n_layer
    ops = [node.op_type for node in onnx.load(str(files["int8"])).graph.node]
    # the fused attention's input projection and the other block linears (3 a layer), and the output head
    assert ops.count("QAttention") == model.config.n_layer
    assert ops.count("MatMulInteger") + ops.count("DynamicQuantizeMatMul") == 3 * model.config.n_layer + 1
