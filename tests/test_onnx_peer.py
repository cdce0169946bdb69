"""bench/onnx_peer.py: our weights exported to ONNX decode, in ONNX Runtime, the tokens our generate() decodes
(fp32), and its int8 graphs really are quantized. Needs the optional onnxruntime, onnx and onnxscript."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from bench.onnx_peer import OrtDecoder, export, quantize_int8  # noqa: E402
from model.generate import generate  # noqa: E402
from model.gpt import GPT  # noqa: E402
from model.sampling import SamplingParams  # noqa: E402
from tests.conftest import small_config  # noqa: E402


def test_onnx_runtime_decodes_our_greedy_tokens_and_its_int8_graph_is_quantized(tmp_path):
    import onnx
    torch.manual_seed(0)
    model = GPT(small_config()).eval()
    prompt_graph, decode_graph = export(model, tmp_path)
    decoder = OrtDecoder.load(prompt_graph, decode_graph, threads=1)
    for batch, length in ((1, 5), (3, 9)):  # batch and lengths are not fixed by the export's example
        prompts = torch.randint(0, 50257, (batch, length))
        ours = generate(model, prompts, SamplingParams(max_new_tokens=10, temperature=0, stop_at_eot=False))
        assert torch.equal(decoder.generate(prompts, 10), ours)
    quantized = quantize_int8(decode_graph, tmp_path / "decode.int8.onnx")
    ops = [node.op_type for node in onnx.load(str(quantized)).graph.node]
    # every block linear (4 a layer) and the output head, as llama.cpp's Q8_0 and our int8 head
    assert ops.count("MatMulInteger") + ops.count("DynamicQuantizeMatMul") == 4 * model.config.n_layer + 1
