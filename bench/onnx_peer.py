"""ONNX Runtime as a decoding peer on our weights: a GPT exported as two ONNX graphs (the prompt, then one
token with the keys and values so far), run by onnxruntime from PyPI in fp32 and dynamically quantized to int8.

    pip install onnxruntime onnx onnxscript      # optional; only bench/experiments/generate_speed.py uses this

The exported step is the model's own arithmetic written without the KV-cache object (which ONNX cannot carry):
the same modules, the keys and values of earlier positions passed in and the new ones returned
(`present_*`), as Hugging Face's optimum runs GPT-2 under ONNX Runtime. ONNX Runtime's int8 is its
`quantize_dynamic` with int8 weights per output channel and activations quantized per tensor at run time,
the scheme quantize/dynamic.py uses. The output head is exported as a matrix of its own, (n_embd, vocabulary),
not as the tied embedding: ONNX Runtime's quantizer only quantizes a MatMul whose weight is a stored tensor, and
with the tied head it left the 154 MB head in fp32, which made its int8 no faster than its fp32 at batch 1 (69.8
against 69.3 new tokens/s in bench/results/generate_speed.json as committed in 827d1b4). So ORT's int8 quantizes
the head as llama.cpp's Q8_0 and our int8 head do; its fp32 graph reads the same bytes either way.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from model.gpt import GPT

THREADS_NOTE = "intra-op threads = torch.get_num_threads(), sequential execution, all graph optimisations"


def untied_head(model: GPT) -> nn.Parameter:
    """The output head's weight as its own (n_embd, vocabulary) matrix, the padding rows left out."""
    return nn.Parameter(model.lm_head.weight.detach()[:model.config.vocab_size].t().contiguous(), requires_grad=False)


class PromptStep(nn.Module):
    """(B, T) prompt tokens -> (last position's logits, keys and values of every layer as (L, B, H, T, D))."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model, self.head = model, untied_head(model)

    def forward(self, idx: torch.Tensor):
        return attend(self.model, self.head, idx, None, None)


class DecodeStep(nn.Module):
    """(B, 1) tokens and the keys and values so far -> (logits, the keys and values with this position added)."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model, self.head = model, untied_head(model)

    def forward(self, idx: torch.Tensor, past_keys: torch.Tensor, past_values: torch.Tensor):
        return attend(self.model, self.head, idx, past_keys, past_values)


def attend(model: GPT, head: torch.Tensor, idx, past_keys, past_values):
    """GPT.forward's arithmetic (model/gpt.py) with the cache as tensors and the head as `head` (untied_head);
    `past_*` None for the prompt."""
    t = model.transformer
    B, T = idx.shape
    start = 0 if past_keys is None else past_keys.shape[3]
    x = t.wte(idx) + t.wpe(torch.arange(T) + start)
    keys, values = [], []
    for layer, block in enumerate(t.h):
        attn = block.attn
        q, k, v = attn.c_attn(block.ln_1(x)).split(attn.n_head * attn.head_dim, dim=2)
        q, k, v = (z.view(B, T, attn.n_head, attn.head_dim).transpose(1, 2) for z in (q, k, v))
        if past_keys is not None:
            k, v = torch.cat([past_keys[layer], k], dim=2), torch.cat([past_values[layer], v], dim=2)
        keys.append(k)
        values.append(v)
        # A decoded token attends every key; the prompt attends causally.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=past_keys is None)
        x = x + attn.c_proj(y.transpose(1, 2).reshape(B, T, attn.n_head * attn.head_dim))
        x = x + block.mlp(block.ln_2(x))
    logits = t.ln_f(x[:, -1:]) @ head
    return logits, torch.stack(keys), torch.stack(values)


def export(model: GPT, folder: Path) -> tuple[Path, Path]:
    """(prompt graph, decode graph) as ONNX files in `folder`, batch and lengths dynamic."""
    model = model.eval()
    prompt, decode = folder / "prompt.onnx", folder / "decode.onnx"
    cfg = model.config
    idx = torch.randint(0, cfg.vocab_size, (2, 4))
    shape = (cfg.n_layer, 2, cfg.n_head, 4, cfg.head_dim)
    past = (torch.randn(shape), torch.randn(shape))
    batch, length, past_length = torch.export.Dim("batch"), torch.export.Dim("length"), torch.export.Dim("past")
    with torch.no_grad():
        torch.onnx.export(PromptStep(model), (idx,), prompt, dynamo=True, external_data=False,
                          input_names=["idx"], output_names=["logits", "present_keys", "present_values"],
                          dynamic_shapes=({0: batch, 1: length},), verbose=False)
        torch.onnx.export(DecodeStep(model), (idx[:, :1], *past), decode, dynamo=True, external_data=False,
                          input_names=["idx", "past_keys", "past_values"],
                          output_names=["logits", "present_keys", "present_values"],
                          dynamic_shapes=({0: batch}, {1: batch, 3: past_length}, {1: batch, 3: past_length}),
                          verbose=False)
    return prompt, decode


def quantize_int8(graph: Path, out: Path) -> Path:
    """ONNX Runtime's dynamic int8: weights int8 per output channel, activations per tensor at run time, after
    the shape inference and graph clean-up its quantizer asks for (without them it left the graph 1.7x
    slower here)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process
    prepared = out.with_name(f"{graph.stem}.prepared.onnx")
    quant_pre_process(str(graph), str(prepared))
    quantize_dynamic(prepared, out, weight_type=QuantType.QInt8, per_channel=True)
    return out


INT8_SETTINGS = ("onnxruntime.quantization: quant_pre_process, then quantize_dynamic(weight_type=QInt8, "
                 "per_channel=True), the output head exported untied so that it is quantized too")


@dataclass
class OrtDecoder:
    """Greedy decoding with a (prompt, decode) pair of ONNX graphs in ONNX Runtime."""
    prompt: object  # onnxruntime.InferenceSession
    decode: object

    @classmethod
    def load(cls, prompt: Path, decode: Path, threads: int) -> OrtDecoder:
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        providers = ["CPUExecutionProvider"]
        return cls(ort.InferenceSession(str(prompt), options, providers=providers),
                   ort.InferenceSession(str(decode), options, providers=providers))

    def generate(self, idx: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """The prompts (B, T) followed by `new_tokens` greedy tokens, as model.generate.generate returns them."""
        tokens = idx.numpy()
        logits, keys, values = self.prompt.run(None, {"idx": tokens})
        out = [tokens]
        for i in range(new_tokens):
            token = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
            out.append(token)
            if i + 1 < new_tokens:
                logits, keys, values = self.decode.run(None, {"idx": token, "past_keys": keys, "past_values": values})
        return torch.from_numpy(np.concatenate(out, axis=1))


def ort_files(model: GPT, folder: Path) -> dict[str, tuple[Path, Path]]:
    """{"fp32": (prompt graph, decode graph), "int8": (...)}: `model` exported into `folder` and quantized."""
    folder.mkdir(parents=True, exist_ok=True)
    prompt, decode = export(model, folder)
    int8 = tuple(quantize_int8(g, folder / f"{g.stem}.int8.onnx") for g in (prompt, decode))
    return {"fp32": (prompt, decode), "int8": int8}


def ort_decoders(model: GPT, threads: int, work_dir: Path | None = None) -> dict[str, OrtDecoder]:
    """{"fp32": ..., "int8": ...} ONNX Runtime decoders for `model` (exported into `work_dir`, or a
    temporary folder)."""
    files = ort_files(model, Path(work_dir or tempfile.mkdtemp(prefix="onnx-peer-")))
    return {name: OrtDecoder.load(*graphs, threads) for name, graphs in files.items()}
