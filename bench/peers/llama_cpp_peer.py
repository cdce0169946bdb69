"""llama.cpp as a decoding peer on our weights: the GPT written as a GGUF file of llama.cpp's `gpt2`
architecture in F32, quantized to Q8_0 by llama.cpp's own quantizer, and decoded through llama-cpp-python.

    pip install gguf llama-cpp-python     # optional; pip builds llama.cpp from source (4.5 minutes on 2 cores here)

bench/experiments/generate_speed.py decodes with it at every batch size, through llama.cpp's C API (several
sequences in one context), and bench/experiments/serve_speed.py serves the same file with llama.cpp's own
server.  The GGUF file holds what `convert_hf_to_gguf.py` would write for GPT-2: the hyper-parameters, the
tokenizer (byte-level BPE tokens and merges, rebuilt from tiktoken's ranks, since llama.cpp refuses a file
without them; the benchmark feeds token ids and never tokenizes text) and the tensors under llama.cpp's
names, each linear weight as (out, in) rows, the output head tied to the token embedding.
"""
from __future__ import annotations

import ctypes
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from model.gpt import GPT

EOT = 50256
SETUP = ("llama.cpp's C API through llama-cpp-python, as its `batched` example: one context with a sequence slot per "
         "row, each row's prompt in one llama_batch, then a token per row each step; context defaults "
         "(llama_context_default_params), n_threads = n_threads_batch = ours; Q8_0 by llama_model_quantize")


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
    quiet_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    status = llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), ctypes.byref(params))
    if status != 0:
        raise RuntimeError(f"llama.cpp could not quantize {f32} to Q8_0 (status {status})")
    return out


_quiet_log = None  # the C callback given to llama.cpp, kept alive for as long as llama.cpp may call it


def quiet_llama_cpp() -> None:
    """llama.cpp's log (every load and context, on stderr) discarded."""
    global _quiet_log
    import llama_cpp
    if _quiet_log is None:
        _quiet_log = llama_cpp.llama_log_callback(lambda level, text, user_data: None)
        llama_cpp.llama_log_set(_quiet_log, None)


@dataclass
class LlamaCppDecoder:
    """Greedy decoding of one or several sequences with llama.cpp's own C API, as its `batched` example does it:
    one context with a sequence slot per row, each row's prompt in one llama_batch under its own sequence id
    (logits of its last position only), then one llama_batch of a token per row at every step.
    llama-cpp-python's `Llama` class decodes one sequence only; the context's other settings are llama.cpp's
    defaults (llama_context_default_params)."""
    model: object  # llama_model pointer
    context: object  # llama_context pointer
    rows: int
    vocab: int

    @classmethod
    def load(cls, path: Path, threads: int, context: int, rows: int = 1) -> LlamaCppDecoder:
        import llama_cpp
        quiet_llama_cpp()
        llama_cpp.llama_backend_init()
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
        if not model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = params.n_batch = context * rows  # every row's whole context, and every prompt in one call
        params.n_seq_max = rows
        params.n_threads = params.n_threads_batch = threads
        ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {rows} x {context} positions")
        vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        return cls(model, ctx, rows, vocab)

    def _decode(self, batch, rows: int) -> np.ndarray:
        """Decode `batch`; the greedy next token of each of the first `rows` sequences."""
        import llama_cpp
        status = llama_cpp.llama_decode(self.context, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed (status {status})")
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(self.context), shape=(rows, self.vocab))
        return logits.argmax(axis=1)

    def generate(self, idx: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """The prompts (B, T), B up to the rows it was loaded for, followed by `new_tokens` greedy tokens each, as
        decode.generate.generate returns them."""
        import llama_cpp
        rows, length = idx.shape
        if rows > self.rows:
            raise ValueError(f"this llama.cpp context has {self.rows} sequence slots, not {rows}")
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.context), True)
        batch = llama_cpp.llama_batch_init(rows * length, 0, 1)
        try:
            prompt = idx.tolist()
            for i, (row, position) in enumerate((r, p) for r in range(rows) for p in range(length)):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = prompt[row][position], position, 1
                batch.seq_id[i][0], batch.logits[i] = row, position == length - 1
            batch.n_tokens = rows * length
            out = [self._decode(batch, rows)]
            for step in range(1, new_tokens):
                for row in range(rows):
                    batch.token[row], batch.pos[row], batch.n_seq_id[row] = int(out[-1][row]), length + step - 1, 1
                    batch.seq_id[row][0], batch.logits[row] = row, True
                batch.n_tokens = rows
                out.append(self._decode(batch, rows))
        finally:
            llama_cpp.llama_batch_free(batch)
        return torch.cat([idx, torch.from_numpy(np.stack(out, axis=1)).to(idx.dtype)], dim=1)


def gguf_files(model: GPT, folder: Path) -> dict[str, Path]:
    """{"F32": ..., "Q8_0": ...}: `model` written as GGUF into `folder`, and quantized by llama.cpp."""
    folder.mkdir(parents=True, exist_ok=True)
    f32 = write_gguf(model, folder / "model.f32.gguf")
    return {"F32": f32, "Q8_0": quantize_q8_0(f32, folder / "model.q8_0.gguf")}


SERVER_SETUP = ("llama.cpp's llama-server built from the llama.cpp that llama-cpp-python's sdist vendors (cmake "
                "-DLLAMA_BUILD_SERVER=ON, target llama-server), --parallel = the level's clients (a slot each, "
                "continuous batching on, its default), --ctx-size = slots x (prompt + new tokens), --threads and "
                "--threads-batch = ours, other settings its defaults; streaming /v1/completions")


def check_llama_server(path: str | None, error: type[Exception]) -> None:
    """For the settings of an experiment with a --llama-server option: raise `error` (its UserError) unless `path`
    is None or a file, and the gguf package that writes the model for it is importable -- the project's .venv has
    none; bench/peers/setup.sh's .peers/venv has it -- so that neither is found missing after minutes of
    measuring."""
    if path is None:
        return
    if not Path(path).is_file():
        raise error(f"--llama-server {path} is not a file; build llama.cpp's llama-server (bench/peers/setup.sh "
                    f"does) and give its path")
    if importlib.util.find_spec("gguf") is None:
        raise error("--llama-server needs the gguf package to write the model as GGUF; run with "
                    ".peers/venv/bin/python (bench/peers/setup.sh makes it)")


def llama_server_command(binary: Path, gguf: Path, slots: int, context: int, threads: int) -> list[str]:
    """llama-server serving `gguf` with `slots` sequences of `context` positions each, `{host}` and `{port}` left
    for serve.launch.ServerProcess.start to fill in."""
    return [str(binary), "--model", str(gguf), "--host", "{host}", "--port", "{port}", "--parallel", str(slots),
            "--ctx-size", str(slots * context), "--threads", str(threads), "--threads-batch", str(threads),
            "--no-webui"]


def llama_server_version(binary: Path) -> str:
    """What `llama-server --version` says of its build (version number and commit)."""
    from bench.processes import run_command
    lines = [line for line in run_command([str(binary), "--version"], cwd=None, timeout_s=60).output.splitlines()
             if line.startswith("version")]
    return lines[0].removeprefix("version: ") if lines else "unknown"
