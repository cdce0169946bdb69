"""llama.cpp as a decoding peer on our weights: the GPT written as a GGUF file of llama.cpp's `gpt2`
architecture in F32, quantized to Q8_0 by llama.cpp's own quantizer, and decoded through llama-cpp-python.

    pip install gguf llama-cpp-python     # optional; pip builds llama.cpp from source (4.5 minutes on 2 cores here)

Only bench/experiments/generate_speed.py uses this, at batch 1 (llama-cpp-python's `Llama` decodes one
sequence).  The GGUF file holds what `convert_hf_to_gguf.py` would write for GPT-2: the hyper-parameters, the
tokenizer (byte-level BPE tokens and merges, rebuilt from tiktoken's ranks, since llama.cpp refuses a file
without them; the benchmark feeds token ids and never tokenizes text) and the tensors under llama.cpp's
names, each linear weight as (out, in) rows, the output head tied to the token embedding.
"""
from __future__ import annotations

import ctypes
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from model.gpt import GPT

EOT = 50256


def byte_symbols() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, the alphabet its vocabulary files are written in: printable
    Latin-1 bytes stand for themselves, the rest take the code points from 256 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in symbols]
    symbols.update({b: chr(256 + i) for i, b in enumerate(others)})
    return symbols


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merges, in rank order, that rebuild every multi-byte token: merging a token's bytes by lower
    ranks only ends in exactly two parts, the pair its own merge joins."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:
            candidates = [(ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1)]
            best, i = min(candidates)
            if best >= rank:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


def write_gguf(model: GPT, path: Path) -> Path:
    """`model` as an F32 GGUF file of llama.cpp's gpt2 architecture."""
    import gguf

    from data.tokenizer import get_tokenizer
    cfg = model.config
    if any(cfg.layer_n_head(i) != cfg.n_head or cfg.layer_mlp_hidden(i) != cfg.layer_mlp_hidden(0)
           for i in range(cfg.n_layer)):
        raise ValueError("llama.cpp's gpt2 architecture has one head count and MLP width for every layer; "
                         "this model was pruned to different ones")
    encoding = get_tokenizer()
    ranks = {encoding.decode_single_token_bytes(i): i for i in range(EOT)}
    symbols = byte_symbols()
    spell = lambda b: "".join(symbols[c] for c in b)
    tokens = [spell(t) for t, _ in sorted(ranks.items(), key=lambda item: item[1])] + ["<|endoftext|>"]
    if len(tokens) != cfg.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokens)} tokens, the model {cfg.vocab_size}")
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_context_length(cfg.block_size)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_feed_forward_length(cfg.layer_mlp_hidden(0))
    writer.add_block_count(cfg.n_layer)
    writer.add_head_count(cfg.n_head)
    writer.add_layer_norm_eps(cfg.layer_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 1) + [gguf.TokenType.CONTROL])
    writer.add_token_merges([f"{spell(a)} {spell(b)}" for a, b in merges_from_ranks(ranks)])
    writer.add_bos_token_id(EOT)
    writer.add_eos_token_id(EOT)
    state = {name: t.detach().float().cpu().numpy() for name, t in model.state_dict().items()}
    t = "transformer."
    writer.add_tensor("token_embd.weight", state[f"{t}wte.weight"][:cfg.vocab_size])
    writer.add_tensor("position_embd.weight", state[f"{t}wpe.weight"])
    writer.add_tensor("output_norm.weight", state[f"{t}ln_f.weight"])
    writer.add_tensor("output_norm.bias", state[f"{t}ln_f.bias"])
    names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for layer in range(cfg.n_layer):
        for ours, theirs in names.items():
            for kind in ("weight", "bias"):
                writer.add_tensor(f"blk.{layer}.{theirs}.{kind}", state[f"{t}h.{layer}.{ours}.{kind}"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def quantize_q8_0(f32: Path, out: Path) -> Path:
    """llama.cpp's own Q8_0 (blocks of 32 int8 weights with one fp16 scale) of an F32 GGUF file."""
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    status = llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), ctypes.byref(params))
    if status != 0:
        raise RuntimeError(f"llama.cpp could not quantize {f32} to Q8_0 (status {status})")
    return out


@dataclass
class LlamaCppDecoder:
    """Greedy decoding of one sequence with llama.cpp."""
    llm: object  # llama_cpp.Llama

    @classmethod
    def load(cls, path: Path, threads: int, context: int) -> LlamaCppDecoder:
        import llama_cpp
        return cls(llama_cpp.Llama(model_path=str(path), n_ctx=context, n_batch=context, n_threads=threads,
                                   n_threads_batch=threads, verbose=False))

    def generate(self, idx: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """The prompt (1, T) followed by `new_tokens` greedy tokens, as model.generate.generate returns them."""
        if idx.shape[0] != 1:
            raise ValueError("llama-cpp-python decodes one sequence at a time; batch 1 only")
        import llama_cpp
        llm, vocab = self.llm, self.llm.n_vocab()
        llm.reset()
        llm.eval(idx[0].tolist())
        out = []
        for i in range(new_tokens):
            # The last position's logits, read in place: `Llama.eval` keeps them only with logits_all=True,
            # which would copy every prompt position's.
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
            token = int(np.argmax(logits))
            out.append(token)
            if i + 1 < new_tokens:
                llm.eval([token])
        return torch.cat([idx, torch.tensor([out], dtype=idx.dtype)], dim=1)


def gguf_files(model: GPT, folder: Path) -> dict[str, Path]:
    """{"F32": ..., "Q8_0": ...}: `model` written as GGUF into `folder`, and quantized by llama.cpp."""
    folder.mkdir(parents=True, exist_ok=True)
    f32 = write_gguf(model, folder / "model.f32.gguf")
    return {"F32": f32, "Q8_0": quantize_q8_0(f32, folder / "model.q8_0.gguf")}


def llama_cpp_decoders(model: GPT, threads: int, work_dir: Path | None = None) -> dict[str, LlamaCppDecoder]:
    """{"F32": ..., "Q8_0": ...} llama.cpp decoders for `model` (its GGUF files in `work_dir`, or a temporary
    folder)."""
    files = gguf_files(model, Path(work_dir or tempfile.mkdtemp(prefix="llama-cpp-peer-")))
    return {name: LlamaCppDecoder.load(path, threads, model.config.block_size) for name, path in files.items()}
