"""Decoding runtimes timed each in a process of its own, kept loaded, driven one call at a time.

Timed in one process, runtimes disturb each other: ONNX Runtime's and llama.cpp's thread pools spin for a while
after each call, and PyTorch's OpenMP threads do too, on the very cores the next runtime is about to use; one
runtime's allocations and caches stay behind as well.  A separate process per runtime, waiting on a pipe while
another runs, is how a user runs one of them, and how an outside harness compares them.  The parent sends a
prompt and a number of new tokens; the side generates greedily and answers with its own timing of the call (so
the pipe's cost is not counted) and the tokens.

Sides are built from files the parent wrote once: our weights as an artifact folder, the ONNX graphs, the GGUF
files, the Hugging Face folder (bench/experiments/generate_speed.py).
"""
from __future__ import annotations

import os
import pickle
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from bench.processes import INHERIT, PIPE, Process, start
from runtime.device import synchronize

@dataclass(frozen=True)
class SideSpec:
    """What one side process builds.  `runtime`: "ours" (decode/generate.py on the artifact in files[0], int8 when
    `int8_head` is set, its decode steps `decode`), "onnxruntime" (files: one converted graph), "llama.cpp"
    (files: one GGUF file, decoding up to `rows` sequences at once) or "transformers" (files: a Hugging Face
    folder)."""
    name: str
    runtime: str
    files: tuple[str, ...]
    threads: int
    device: str = "cpu"
    decode: str = "dynamic"
    int8_head: str | None = None
    context: int = 1024  # llama.cpp's context length
    rows: int = 1  # llama.cpp's sequence slots
    cpus: tuple[int, ...] = ()  # the cores the side runs on (as taskset -c), before any thread starts; () all
    root: str | None = None  # a checkout of this project whose code the side runs (an A/B against another commit;
    #                          its files must then be absolute paths); None: this checkout


def step_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters and buffers a decoding step reads in full: all but the embeddings' tables,
    except the token embedding when it is also the output head (tied); a tensor shared by two modules
    counts once, and a derived fp16 head copy counts instead of the fp32 table it was made from."""
    from model.int8 import Fp16WeightLinear
    seen, total = set(), 0
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        if t.data_ptr() in seen or name.startswith("transformer.wpe"):
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    if isinstance(model.lm_head, Fp16WeightLinear):  # it reads its half-precision copy, not the fp32 table
        total -= model.transformer.wte.weight.numel() * 2
    return total


def _ours(spec: SideSpec) -> tuple[Callable[[torch.Tensor, int], torch.Tensor], dict]:
    from decode.generate import generate
    from model.int8 import quantize_model
    from model.packed_linear import pack_for_inference
    from decode.sampling import SamplingParams
    from runtime import huge_pages
    from storage.artifact import load_model
    model, _ = load_model(spec.files[0], spec.device)
    if spec.int8_head is not None:
        quantize_model(model, head=spec.int8_head)
    model_device = torch.device(spec.device)
    kernels = pack_for_inference(model)  # as sample.py loads a model: float32 linears packed for oneDNN on the CPU
    calls = []

    def run(prompt: torch.Tensor, new: int) -> torch.Tensor:
        tokens = generate(model, prompt.to(spec.device), SamplingParams(
            max_new_tokens=new, temperature=0, stop_at_eot=False), decode=spec.decode)
        if not calls and model_device.type == "cpu":  # the warm-up: the weights go onto huge pages before any
            huge_pages.collapse_in_background()  # timed call, as in a server's CPU process or in one that has
            huge_pages.settled(timeout=120)  # decoded a while (decode/trace.py)
        calls.append(new)
        return tokens
    return run, {"kernels": kernels, "step_bytes": step_bytes(model)}


def _transformers(spec: SideSpec) -> tuple[Callable[[torch.Tensor, int], torch.Tensor], dict]:
    import transformers
    model = transformers.GPT2LMHeadModel.from_pretrained(spec.files[0]).to(spec.device).eval()
    eot = model.config.eos_token_id

    def run(prompt: torch.Tensor, new: int) -> torch.Tensor:
        prompt = prompt.to(spec.device)
        with torch.inference_mode():
            return model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                  max_new_tokens=new, min_new_tokens=new, pad_token_id=eot, use_cache=True)
    return run, {"version": transformers.__version__}


def _build(spec: SideSpec) -> tuple[Callable[[torch.Tensor, int], torch.Tensor], dict]:
    """The side's decoder, and what it says of itself (versions, kernels, bytes a step reads)."""
    if spec.cpus:  # before the runtime's threads start: they inherit it
        os.sched_setaffinity(0, spec.cpus)
    torch.set_num_threads(spec.threads)
    if spec.runtime == "ours":
        return _ours(spec)
    if spec.runtime == "onnxruntime":
        import onnxruntime

        from bench.peers.onnx_peer import OrtDecoder
        return OrtDecoder.load(Path(spec.files[0]), spec.threads).generate, {"version": onnxruntime.__version__}
    if spec.runtime == "llama.cpp":
        import llama_cpp

        from bench.peers.llama_cpp_peer import LlamaCppDecoder
        return (LlamaCppDecoder.load(Path(spec.files[0]), spec.threads, spec.context, spec.rows).generate,
                {"version": llama_cpp.__version__})
    if spec.runtime == "transformers":
        return _transformers(spec)
    raise ValueError(f"unknown runtime {spec.runtime!r}")


def _serve(spec: SideSpec, requests, answers) -> None:
    """The side process: build, say so, then answer (prompt, new tokens) with (seconds, tokens) until None."""
    send = lambda message: (pickle.dump(message, answers), answers.flush())
    try:
        decode, about = _build(spec)
    except BaseException:  # the parent names the side and shows its traceback
        send(("error", traceback.format_exc()))
        return
    send(("ready", about))
    device = torch.device(spec.device)
    while (request := pickle.load(requests)) is not None:
        prompt, new_tokens = request
        try:
            synchronize(device)
            start = time.perf_counter()
            tokens = decode(prompt, new_tokens)
            synchronize(device)
            send(("ok", (time.perf_counter() - start, tokens.cpu())))
        except BaseException:
            send(("error", traceback.format_exc()))


class SideError(RuntimeError):
    pass


class Sides:
    """Side processes, started together (their loading overlaps) and ended on leaving the `with` block.  Each
    is a fresh `python -m bench.peers.decode_sides`, which imports only what its runtime needs, talking pickles over
    its stdin and stdout (what a runtime prints goes to stderr)."""

    def __init__(self, specs: list[SideSpec]):
        self.names = [spec.name for spec in specs]
        self.processes: dict[str, Process] = {}
        for spec in specs:
            # Where the parent is: the files it names may be relative to its working directory.  A side of another
            # checkout starts in it, with it first on the path (`python -m` looks in the working directory first).
            process = start([sys.executable, "-m", "bench.peers.decode_sides"], cwd=spec.root,
                            env={"PYTHONPATH": spec.root} if spec.root else None, stdin=PIPE, stderr=INHERIT,
                            text=False)
            if spec.cpus:  # also from here, for a side of an older checkout (--baseline) whose code predates `cpus`
                os.sched_setaffinity(process.pid, spec.cpus)
            pickle.dump(spec, process.stdin)
            process.stdin.flush()
            self.processes[spec.name] = process
        try:
            self.about = {name: self._answer(name) for name in self.names}  # each side's own description
        except SideError:
            self.__exit__()  # the sides that did start are ended, not left waiting on their pipes
            raise

    def __enter__(self) -> Sides:
        return self

    def __exit__(self, *exc) -> None:
        for process in self.processes.values():
            try:
                pickle.dump(None, process.stdin)
                process.stdin.close()
            except OSError:  # it has ended already
                pass
        for process in self.processes.values():
            process.stop(grace_s=10)

    def _answer(self, name: str):
        process = self.processes[name]
        try:
            status, payload = pickle.load(process.stdout)
        except EOFError:
            raise SideError(f"side {name!r} ended (exit code {process.wait()}) without answering; see its output "
                            f"above") from None
        if status == "error":
            raise SideError(f"side {name!r} failed:\n{payload}")
        return payload

    def send(self, name: str, prompt: torch.Tensor, new_tokens: int) -> None:
        """Ask side `name` for `new_tokens` greedy tokens after `prompt`, without waiting (sides asked together run
        together: bench/experiments/user_start.py overlaps their first calls); `receive` reads the answer."""
        stdin = self.processes[name].stdin
        pickle.dump((prompt.cpu(), new_tokens), stdin)
        stdin.flush()

    def receive(self, name: str) -> tuple[float, torch.Tensor]:
        """(seconds the side took, the prompt followed by its greedy tokens) for the request `send` made."""
        return self._answer(name)

    def generate(self, name: str, prompt: torch.Tensor, new_tokens: int) -> tuple[float, torch.Tensor]:
        """(seconds the side took, the prompt followed by its `new_tokens` greedy tokens)."""
        self.send(name, prompt, new_tokens)
        return self.receive(name)


if __name__ == "__main__":
    # The protocol keeps the real stdout; anything printed (by us or a runtime's library) goes to stderr.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    requests = sys.stdin.buffer
    _serve(pickle.load(requests), requests, answers)
    # Out without the interpreter's teardown (unloading torch and a runtime's libraries: about half a second
    # of CPU a side, which the parent waits for as it leaves its `with` block); nothing is left to write.
    answers.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
