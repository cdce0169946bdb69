"""ONNX Runtime as a decoding peer on our weights, set up as its own GPT-2 guide does it: the model exported by
ONNX Runtime's GPT-2 converter (onnxruntime.transformers.models.gpt2), fused by its transformer optimizer, int8 by
the converter's dynamic quantization, and decoded greedily with the caches kept bound as OrtValues (IO binding).

    pip install onnxruntime onnx "transformers==4.44.2"   # optional; only bench/experiments/generate_speed.py
                                                          # and bench/experiments/serve_speed.py use this

Why these steps, and where they differ from `python -m onnxruntime.transformers.models.gpt2.convert_to_onnx`:
- The converter exports a Hugging Face GPT2LMHeadModel, so our weights are written as one first
  (storage/export.py).  Its no-padding class is used (inputs: the token ids and one cache per layer, each
  (2, batch, heads, length, head size)): the benchmark's rows have equal lengths.
- The model is loaded with eager attention: the converter's TorchScript export at opset 11 cannot write PyTorch's
  fused attention (transformers' default), and eager attention is the pattern its optimizer fuses into its
  `Attention` operator.  Its own command line loads the default and fails that way.
- transformers 4.44: the converter hands GPT-2 its cache as a tuple, which transformers 5 refuses
  (AttributeError: 'tuple' object has no attribute 'get_query_offset', with 5.24).
- The optimizer (model type gpt2) fuses the embedding and first layer norm, every attention, GELU and skip layer
  norm; the int8 graph is the converter's `--precision int8`: quantize_dynamic over the fused graph, which
  quantizes the output head too (llama.cpp's Q8_0 and our int8 head do as well).
- Each step's `present` outputs are bound as the next step's `past` inputs (IO binding), never copied out to
  numpy and back, as ONNX Runtime's docs advise for a decoder loop; only each step's logits are read.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from model.gpt import GPT
from storage.export import export_hf_gpt2

SETUP = ("ONNX Runtime's GPT-2 converter (Gpt2Helper.export_onnx, no-padding model, eager attention), its "
         "transformer optimizer (optimize_model, model_type gpt2: Attention, FastGelu, SkipLayerNormalization, "
         "EmbedLayerNormalization fused), int8 as its --precision int8 (quantize_dynamic of the fused graph); "
         "CPU provider, intra-op threads = ours, sequential execution, ORT_ENABLE_ALL; caches bound as OrtValues "
         "between steps (IO binding)")


def ort_files(model: GPT, folder: Path) -> dict[str, Path]:
    """{"fp32": fused graph, "int8": its dynamic int8}: `model` written as a Hugging Face GPT-2 into `folder`
    and converted there as ONNX Runtime's GPT-2 converter does."""
    import onnx
    from onnxruntime.quantization import quantize_dynamic
    from onnxruntime.transformers.models.gpt2.gpt2_helper import Gpt2Helper, MyGPT2LMHeadModel_NoPadding
    from onnxruntime.transformers.optimizer import optimize_model
    folder.mkdir(parents=True, exist_ok=True)
    export_hf_gpt2(model, folder / "hf")
    hf = MyGPT2LMHeadModel_NoPadding.from_pretrained(folder / "hf", attn_implementation="eager").eval()
    raw, fp32, int8 = folder / "raw.onnx", folder / "fp32.onnx", folder / "int8.onnx"
    Gpt2Helper.export_onnx(hf, torch.device("cpu"), str(raw), has_position_ids=False, has_attention_mask=False,
                           input_ids_dtype=torch.int64)
    cfg = model.config
    optimize_model(str(raw), model_type="gpt2", num_heads=cfg.n_head, hidden_size=cfg.n_embd
                   ).save_model_to_file(str(fp32))
    quantize_dynamic(fp32, int8, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    raw.unlink()
    return {"fp32": fp32, "int8": int8}


@dataclass
class OrtDecoder:
    """Greedy decoding with one converted GPT-2 graph in ONNX Runtime: the prompt is the first step, with caches
    of length 0, as the converter's own tests run it."""
    session: object  # onnxruntime.InferenceSession

    @classmethod
    def load(cls, graph: Path, threads: int) -> OrtDecoder:
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return cls(ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"]))

    def _run(self, inputs: dict) -> list:
        """One step with `inputs` (name -> OrtValue); every output left where ONNX Runtime put it."""
        binding = self.session.io_binding()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        for output in self.session.get_outputs():
            binding.bind_output(output.name, "cpu")
        self.session.run_with_iobinding(binding)
        return binding.get_outputs()

    def generate(self, idx: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """The prompts (B, T) followed by `new_tokens` greedy tokens, as decode.generate.generate returns them."""
        from onnxruntime import OrtValue
        tokens = idx.numpy()
        past = self.session.get_inputs()[1:]
        _, _, heads, _, head_size = past[0].shape
        empty = OrtValue.ortvalue_from_numpy(np.zeros((2, len(tokens), heads, 0, head_size), np.float32))
        outputs = self._run({"input_ids": OrtValue.ortvalue_from_numpy(tokens), **{p.name: empty for p in past}})
        out = [tokens]
        for i in range(new_tokens):
            token = outputs[0].numpy()[:, -1].argmax(-1)[:, None].astype(np.int64)
            out.append(token)
            if i + 1 < new_tokens:
                outputs = self._run({"input_ids": OrtValue.ortvalue_from_numpy(token),
                                     **{p.name: value for p, value in zip(past, outputs[1:])}})
        return torch.from_numpy(np.concatenate(out, axis=1))
