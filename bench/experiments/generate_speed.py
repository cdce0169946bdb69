"""Decoding speed against the runtimes a CPU user would pick, on the same weights in the same run: ONNX
Runtime in fp32 and dynamic int8 (bench/onnx_peer.py), llama.cpp in F32 and Q8_0 at batch 1
(bench/llama_cpp_peer.py), and Hugging Face transformers, each when installed.

    pip install onnxruntime onnx onnxscript transformers   # the peers; each is optional
    pip install gguf llama-cpp-python                      # builds llama.cpp from source: 4.5 min on 2 cores
    python -m bench.experiments generate_speed           # GPT-2 124M config, random weights, 32-token prompts,
                                                         # 64 new tokens, greedy, batches 1 and 12

Ours is `generate()` on the model as sample.py runs it: float32 linears packed for oneDNN
(model/packed_linear.py), and the int8 artifact's model (model/int8.py) with the tied embedding / output head
in int8 too (`quantize/dynamic.py --head int8`; `--int8-head` picks another format), as llama.cpp's Q8_0
quantizes GPT-2's tied token-embedding / output matrix. Its decode steps run as one traced graph each
(`sample.py --decode traced`, model/decode_trace.py; `--decode` picks another mode); the trace, under a
second once per batch size, is made in the untimed first call, as ONNX Runtime's export and llama.cpp's
conversion are. Every side decodes greedily with a KV cache from identical weights; the calls are timed in
interleaved rounds whose order alternates, so that machine noise hits all alike, and each ratio is the median
of per-round ratios. Speeds
are new tokens per second with the prompt's prefill included. The fp32 tokens of every peer are compared with
ours; the int8 sides are compared with our fp32 tokens (agreement: the share of equal new tokens).

Effective bandwidth at batch 1: the bytes of the matrices a decoding step reads (block linears, layer norms
and the output head; not the one embedding row per token) times the steps per second, against the machine's
read bandwidth measured in the same run (a sum over 1 GiB of float32, median of 5). On a CUDA device our
decoding is also timed with its decode steps replayed as one captured CUDA graph (model/decode_graph.py).
"""
from __future__ import annotations

import copy
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiment import Experiment, SettingsError, at_least
from bench.record import plt
from bench.report_page import Page, spread
from model.config import PRESETS, preset
from model.generate import DECODE_MODES, fastest_decode, generate
from model.gpt import GPT
from model.hf import export_hf_gpt2
from model.int8 import HEAD_FORMATS, Fp16WeightLinear, quantize_model
from model.packed_linear import pack_for_inference
from model.sampling import SamplingParams
from runtime.cli import option
from runtime.device import choose_device
from runtime.timing import Environment, Spread, environment, paired_ratio, time_interleaved

EOT = 50256


@dataclass
class Settings:
    model: str = option("gpt2", "model preset (random weights)", choices=tuple(PRESETS))
    prompt_tokens: int = option(32, "random prompt length")
    new_tokens: int = option(64, "tokens generated per row")
    batch_sizes: list[int] = option([1, 12], "rows generated together")
    repeats: int = option(5, "timed repeats of each side (interleaved)")
    onnx: bool = option(True, "time ONNX Runtime beside ours when onnxruntime is installed (its export takes "
                              "about a minute for GPT-2 124M)")
    llama_cpp: bool = option(True, "time llama.cpp F32 and Q8_0 beside ours at batch 1 when llama-cpp-python and "
                                   "gguf are installed")
    int8_head: str = option("int8", "head format of our int8 model (quantize/dynamic.py --head): int8 matches "
                                    "llama.cpp's Q8_0, which quantizes the tied output matrix too",
                            choices=HEAD_FORMATS)
    decode: str = option("auto", "how our decode steps run (sample.py --decode; auto: its default)",
                         choices=DECODE_MODES)
    device: str = option("auto", "auto, cpu, cuda, ...")

    def __post_init__(self):
        at_least(self, 1, "prompt_tokens", "new_tokens", "repeats", "batch_sizes")


@dataclass
class Peer:
    """One other runtime's figures at one batch size."""
    tokens_per_s: Spread
    ours_over_peer: float  # our new tokens/s over theirs, per-round median (the int8 peer against our int8)
    token_agreement: float  # the share of its new tokens equal to our fp32 ones
    identical_tokens: bool


@dataclass
class GenerationRow:
    batch: int
    ours_tokens_per_s: Spread  # fp32
    ours_int8_tokens_per_s: Spread | None = None  # CPU only
    ours_int8_token_agreement: float | None = None  # with our fp32 tokens
    ort_fp32: Peer | None = None  # None: onnxruntime not installed (or --no-onnx, or not on the CPU)
    ort_int8: Peer | None = None
    llama_f32: Peer | None = None  # batch 1 only; None: llama-cpp-python not installed (or --no-llama-cpp)
    llama_q8_0: Peer | None = None  # against our int8
    hf_tokens_per_s: Spread | None = None  # None: transformers is not installed
    speedup: float | None = None  # ours over transformers
    identical_tokens: bool | None = None
    # Our decode steps as eager PyTorch (the dynamic cache), beside --decode's; None when that is dynamic.
    eager_tokens_per_s: Spread | None = None
    eager_int8_tokens_per_s: Spread | None = None
    decode_speedup: float | None = None  # --decode's steps over the eager ones, fp32
    decode_int8_speedup: float | None = None
    decode_identical_tokens: bool | None = None  # fp32 tokens of both the same
    # On CUDA: decode steps replayed as one captured CUDA graph (model/decode_graph.py); None elsewhere.
    graph_tokens_per_s: Spread | None = None
    graph_speedup: float | None = None  # over our eager decoding
    graph_identical_tokens: bool | None = None


@dataclass
class Bandwidth:
    """Batch 1: the weight bytes one decoding step reads, and each side's rate of reading them."""
    read_gb_per_s: Spread  # the machine's, measured in this run (before and after the timed rounds)
    fp32_step_bytes: int
    int8_step_bytes: int
    gb_per_s: dict[str, float]  # side -> weight bytes x new tokens/s / 1e9
    share_of_read: dict[str, float]


@dataclass
class GenerateSpeed:
    model: str
    prompt_tokens: int
    new_tokens: int
    linear_kernels: str  # what pack_for_inference did to our fp32 model
    decode: str  # how our decode steps ran (model/generate.py's DECODE_MODES)
    int8_head: str | None
    onnxruntime: str | None  # its version; None when not measured
    ort_int8_settings: str | None
    llama_cpp: str | None  # llama-cpp-python's version; None when not measured
    transformers: str | None  # its version; None when not installed
    results: list[GenerationRow]
    bandwidth: Bandwidth | None
    environment: Environment


def hf_model(ours: GPT, device: torch.device):
    """transformers' GPT2LMHeadModel with our weights, or None when transformers is not installed."""
    try:
        import transformers
    except ImportError:
        print("transformers is not installed (pip install transformers): not measured", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory() as tmp:
        export_hf_gpt2(ours, tmp)
        return transformers.GPT2LMHeadModel.from_pretrained(tmp).to(device).eval()


def ort_peers(ours: GPT, settings: Settings, device: torch.device, work_dir: Path):
    """ONNX Runtime decoders {"fp32", "int8"} on our weights, or None when not measured (said why)."""
    if not settings.onnx or device.type != "cpu":
        return None
    try:
        import onnxruntime  # noqa: F401
        from bench.onnx_peer import ort_decoders
    except ImportError:
        print("onnxruntime is not installed (pip install onnxruntime onnx onnxscript): not measured",
              file=sys.stderr)
        return None
    print("exporting the model to ONNX and quantizing it with ONNX Runtime", file=sys.stderr, flush=True)
    return ort_decoders(ours, torch.get_num_threads(), work_dir / "onnx")


def llama_cpp_peers(ours: GPT, settings: Settings, device: torch.device, work_dir: Path):
    """llama.cpp decoders {"F32", "Q8_0"} on our weights, or None when not measured (said why)."""
    if not settings.llama_cpp or device.type != "cpu" or 1 not in settings.batch_sizes:
        return None
    try:
        import gguf  # noqa: F401
        import llama_cpp  # noqa: F401

        from bench.llama_cpp_peer import llama_cpp_decoders
    except ImportError:
        print("llama-cpp-python or gguf is not installed (pip install gguf llama-cpp-python): not measured",
              file=sys.stderr)
        return None
    print("writing the model as GGUF and quantizing it with llama.cpp", file=sys.stderr, flush=True)
    return llama_cpp_decoders(ours, torch.get_num_threads(), work_dir / "gguf")


def read_bandwidth(repeats: int = 5) -> list[float]:
    """GB/s of each of `repeats` sums over 1 GiB of float32 with this process's threads: what streaming
    weights can reach."""
    data = torch.ones(2**28)  # the values do not change a sum's memory traffic; filling with ones is quick
    data.sum()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        rates.append(data.numel() * 4 / (time.perf_counter() - start) / 1e9)
    return rates


def step_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters and buffers a decoding step reads in full: all but the embeddings' tables,
    except the token embedding when it is also the output head (tied); a tensor shared by two modules
    counts once, and a derived fp16 head copy counts instead of the fp32 table it was made from."""
    seen, total = set(), 0
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    for name, t in tensors:
        if t.data_ptr() in seen or name.startswith("transformer.wpe"):
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    if isinstance(model.lm_head, Fp16WeightLinear):  # it reads its half-precision copy, not the fp32 table
        total -= model.transformer.wte.weight.numel() * 2
    return total


def agreement(reference: torch.Tensor, candidate: torch.Tensor, prompt_tokens: int) -> float:
    return float((reference[:, prompt_tokens:] == candidate[:, prompt_tokens:]).float().mean())


def measure(settings: Settings, work_dir: Path) -> GenerateSpeed:
    device = choose_device(settings.device)
    torch.manual_seed(0)
    read_before = read_bandwidth() if device.type == "cpu" else []
    model = GPT(preset(settings.model)).to(device).eval()
    if settings.prompt_tokens + settings.new_tokens > model.config.block_size:
        raise SettingsError(f"--prompt-tokens + --new-tokens exceed the {settings.model} context of "
                            f"{model.config.block_size}")
    theirs = hf_model(model, device)
    ort = ort_peers(model, settings, device, Path(work_dir))
    llama = llama_cpp_peers(model, settings, device, Path(work_dir))
    int8 = None
    if device.type == "cpu":
        int8 = copy.deepcopy(model)
        quantize_model(int8, head=settings.int8_head)
        pack_for_inference(int8)
    ours = model
    kernels = pack_for_inference(ours)
    print(f"ours: {kernels}", file=sys.stderr)
    params = SamplingParams(max_new_tokens=settings.new_tokens, temperature=0, stop_at_eot=False)
    decode = fastest_decode(ours, device) if settings.decode == "auto" else settings.decode
    rows = []
    for batch in settings.batch_sizes:
        prompt = torch.randint(0, model.config.vocab_size, (batch, settings.prompt_tokens), device=device)

        def run_theirs():
            with torch.inference_mode():
                return theirs.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                       max_new_tokens=settings.new_tokens, min_new_tokens=settings.new_tokens,
                                       pad_token_id=EOT, use_cache=True)

        calls = {"ours": lambda: generate(ours, prompt, params, decode=decode)}
        if int8 is not None:
            calls["ours int8"] = lambda: generate(int8, prompt, params, decode=decode)
        eager = decode != "dynamic"
        if eager:
            calls["ours eager"] = lambda: generate(ours, prompt, params, decode="dynamic")
            if int8 is not None:
                calls["ours int8 eager"] = lambda: generate(int8, prompt, params, decode="dynamic")
        if ort:
            calls["ort fp32"] = lambda: ort["fp32"].generate(prompt, settings.new_tokens)
            calls["ort int8"] = lambda: ort["int8"].generate(prompt, settings.new_tokens)
        if llama and batch == 1:
            calls["llama.cpp F32"] = lambda: llama["F32"].generate(prompt, settings.new_tokens)
            calls["llama.cpp Q8_0"] = lambda: llama["Q8_0"].generate(prompt, settings.new_tokens)
        if theirs:
            calls["theirs"] = run_theirs
        if device.type == "cuda":
            calls["graph"] = lambda: generate(ours, prompt, params, decode="cuda-graph")
        tokens = {name: call() for name, call in calls.items()}
        seconds = time_interleaved(calls, settings.repeats, warmup=0, device=device, alternate=True,
                                   progress=f"batch {batch}")
        new = batch * settings.new_tokens
        speed = {name: Spread.of([new / t for t in times]) for name, times in seconds.items()}
        same = lambda name: bool(torch.equal(tokens["ours"].cpu(), tokens[name].cpu()))
        agree = lambda name: agreement(tokens["ours"].cpu(), tokens[name].cpu(), settings.prompt_tokens)
        row = GenerationRow(batch, speed["ours"])
        if int8 is not None:
            row.ours_int8_tokens_per_s = speed["ours int8"]
            row.ours_int8_token_agreement = agree("ours int8")
        if ort:
            row.ort_fp32 = Peer(speed["ort fp32"], paired_ratio(seconds["ort fp32"], seconds["ours"]),
                                agree("ort fp32"), same("ort fp32"))
            row.ort_int8 = Peer(speed["ort int8"], paired_ratio(seconds["ort int8"], seconds["ours int8"]),
                                agree("ort int8"), same("ort int8"))
        if "llama.cpp F32" in calls:
            row.llama_f32 = Peer(speed["llama.cpp F32"], paired_ratio(seconds["llama.cpp F32"], seconds["ours"]),
                                 agree("llama.cpp F32"), same("llama.cpp F32"))
            row.llama_q8_0 = Peer(speed["llama.cpp Q8_0"],
                                  paired_ratio(seconds["llama.cpp Q8_0"], seconds["ours int8"]),
                                  agree("llama.cpp Q8_0"), same("llama.cpp Q8_0"))
        if eager:
            row.eager_tokens_per_s = speed["ours eager"]
            row.decode_speedup = paired_ratio(seconds["ours eager"], seconds["ours"])
            row.decode_identical_tokens = same("ours eager")
            if int8 is not None:
                row.eager_int8_tokens_per_s = speed["ours int8 eager"]
                row.decode_int8_speedup = paired_ratio(seconds["ours int8 eager"], seconds["ours int8"])
        if "graph" in calls:
            row.graph_tokens_per_s = speed["graph"]
            row.graph_speedup = paired_ratio(seconds["ours eager" if eager else "ours"], seconds["graph"])
            row.graph_identical_tokens = same("graph")
        if theirs:
            row.hf_tokens_per_s = speed["theirs"]
            row.speedup = paired_ratio(seconds["theirs"], seconds["ours"])
            row.identical_tokens = same("theirs")
        rows.append(row)
        print(f"batch {batch:>2}: " + ", ".join(f"{name} {s.median:.1f}" for name, s in speed.items())
              + " new tokens/s" + (f"; ONNX Runtime fp32 tokens identical: {row.ort_fp32.identical_tokens}"
                                   if ort else ""), flush=True)
    bandwidth = None
    if device.type == "cpu" and 1 in settings.batch_sizes:
        row = rows[settings.batch_sizes.index(1)]
        fp32_bytes, int8_bytes = step_bytes(ours), step_bytes(int8)
        sides = {"ours fp32": (row.ours_tokens_per_s, fp32_bytes),
                 "ours int8": (row.ours_int8_tokens_per_s, int8_bytes)}
        if ort:
            sides["onnxruntime fp32"] = (row.ort_fp32.tokens_per_s, fp32_bytes)
        if row.llama_f32:  # the same tensors (its head has the 50,257 rows, not our padded 50,304: 0.1% fewer bytes)
            sides["llama.cpp F32"] = (row.llama_f32.tokens_per_s, fp32_bytes)
        read = Spread.of(read_before + read_bandwidth())
        gb = {name: s.median * size / 1e9 for name, (s, size) in sides.items()}
        bandwidth = Bandwidth(read, fp32_bytes, int8_bytes, gb, {name: v / read.median for name, v in gb.items()})
        print(f"read bandwidth {read.median:.1f} GB/s; at batch 1 " + ", ".join(
            f"{name} {v:.1f} GB/s ({v / read.median:.0%})" for name, v in gb.items()), flush=True)
    ort_version = ort_int8 = None
    if ort:
        from bench.onnx_peer import INT8_SETTINGS
        ort_version, ort_int8 = sys.modules["onnxruntime"].__version__, INT8_SETTINGS
    return GenerateSpeed(settings.model, settings.prompt_tokens, settings.new_tokens, kernels, decode,
                         settings.int8_head if int8 is not None else None, ort_version, ort_int8,
                         sys.modules["llama_cpp"].__version__ if llama else None,
                         sys.modules["transformers"].__version__ if theirs else None, rows, bandwidth,
                         environment(device))


def plot(result: GenerateSpeed):
    sides = [("ours fp32", lambda r: r.ours_tokens_per_s),
             ("ONNX Runtime fp32", lambda r: r.ort_fp32 and r.ort_fp32.tokens_per_s),
             ("ours int8", lambda r: r.ours_int8_tokens_per_s),
             ("ONNX Runtime int8", lambda r: r.ort_int8 and r.ort_int8.tokens_per_s),
             ("llama.cpp F32", lambda r: r.llama_f32 and r.llama_f32.tokens_per_s),
             ("llama.cpp Q8_0", lambda r: r.llama_q8_0 and r.llama_q8_0.tokens_per_s),
             (f"transformers {result.transformers}", lambda r: r.hf_tokens_per_s)]
    sides = [(label, get) for label, get in sides if any(get(r) for r in result.results)]
    fig, axes = plt.subplots(1, len(result.results), figsize=(4.5 * len(result.results), 3.8), squeeze=False)
    for ax, row in zip(axes[0], result.results):
        values = [get(row).median if get(row) else 0.0 for _, get in sides]
        bars = ax.bar(range(len(sides)), values, color=[f"C{i}" for i in range(len(sides))])
        # llama.cpp runs one sequence only: its batch-12 bars are absent, not zero
        ax.bar_label(bars, labels=[f"{v:.0f}" if get(row) else "not run" for v, (_, get) in zip(values, sides)],
                     fontsize=8)
        ax.set_xticks(range(len(sides)), [label for label, _ in sides], rotation=25, ha="right", fontsize=8)
        ax.set_title(f"batch {row.batch}")
        ax.set_ylabel("new tokens / s")
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{result.model}: {result.prompt_tokens}-token prompts, {result.new_tokens} new tokens, greedy")
    fig.tight_layout()
    return fig


def section(res: GenerateSpeed, page: Page) -> None:
    page.add(f"`{res.model}` with random weights, {res.prompt_tokens}-token prompts, {res.new_tokens} new tokens, "
             f"greedy with a KV cache, new tokens/s with the prefill included (median, range). "
             f"Ours: {res.linear_kernels}, decode steps {res.decode}"
             + (f"; int8 with the {res.int8_head} head" if res.int8_head else "")
             + (f". ONNX Runtime {res.onnxruntime} on the same weights (int8: {res.ort_int8_settings})"
                if res.onnxruntime else ". ONNX Runtime was not measured")
             + (f"; transformers {res.transformers}.\n" if res.transformers else "; transformers was not installed.\n"))
    ratio = lambda v: "n/a" if v is None else f"{v:.2f}x"
    page.table(["batch", "ours fp32", "ONNX Runtime fp32", "ours / ORT fp32", "fp32 tokens identical",
                "ours int8", "ONNX Runtime int8", "ours / ORT int8", "int8 agreement with fp32 (ours / ORT)"],
               [[r.batch, spread(r.ours_tokens_per_s), spread(r.ort_fp32 and r.ort_fp32.tokens_per_s),
                 ratio(r.ort_fp32 and r.ort_fp32.ours_over_peer),
                 "n/a" if r.ort_fp32 is None else "yes" if r.ort_fp32.identical_tokens else "**no**",
                 spread(r.ours_int8_tokens_per_s), spread(r.ort_int8 and r.ort_int8.tokens_per_s),
                 ratio(r.ort_int8 and r.ort_int8.ours_over_peer),
                 "n/a" if r.ours_int8_token_agreement is None else
                 f"{r.ours_int8_token_agreement:.0%} / "
                 + ("n/a" if r.ort_int8 is None else f"{r.ort_int8.token_agreement:.0%}")]
                for r in res.results])
    with_llama = [r for r in res.results if r.llama_f32]
    if with_llama:
        page.add(f"llama.cpp (llama-cpp-python {res.llama_cpp}) on the same weights written as GGUF, F32 and its own "
                 f"Q8_0, one sequence:\n")
        page.table(["batch", "llama.cpp F32", "ours fp32 / llama.cpp F32", "F32 tokens identical", "llama.cpp Q8_0",
                    "ours int8 / llama.cpp Q8_0", "Q8_0 agreement with our fp32"],
                   [[r.batch, spread(r.llama_f32.tokens_per_s), ratio(r.llama_f32.ours_over_peer),
                     "yes" if r.llama_f32.identical_tokens else f"**no** ({r.llama_f32.token_agreement:.0%} agree)",
                     spread(r.llama_q8_0.tokens_per_s), ratio(r.llama_q8_0.ours_over_peer),
                     f"{r.llama_q8_0.token_agreement:.0%}"] for r in with_llama])
    else:
        page.add("llama.cpp was not measured (llama-cpp-python and gguf not installed, or --no-llama-cpp).\n")
    if res.bandwidth:
        b = res.bandwidth
        page.add(f"Batch 1 against the machine's read bandwidth, {spread(b.read_gb_per_s)} GB/s (sums over 1 GiB "
                 f"before and after the timed rounds); a step reads {b.fp32_step_bytes / 1e6:,.0f} MB of weights in "
                 f"fp32 and "
                 f"{b.int8_step_bytes / 1e6:,.0f} MB in int8:\n")
        page.table(["side", "GB/s", "share of read bandwidth"],
                   [[name, f"{v:.1f}", f"{b.share_of_read[name]:.0%}"] for name, v in b.gb_per_s.items()])
    if any(r.hf_tokens_per_s for r in res.results):
        page.table(["batch", "transformers new tokens/s", "ours fp32 / transformers", "identical tokens"],
                   [[r.batch, spread(r.hf_tokens_per_s), ratio(r.speedup),
                     "n/a" if r.identical_tokens is None else "yes" if r.identical_tokens else "**no**"]
                    for r in res.results])
    traced = [r for r in res.results if r.eager_tokens_per_s is not None]
    if traced:
        page.add(f"Our decode steps {res.decode} against the same steps as eager PyTorch (`--decode dynamic`), in the "
                 f"same rounds:\n")
        page.table(["batch", f"fp32 {res.decode}", "fp32 eager", "speed-up", "tokens identical",
                    f"int8 {res.decode}", "int8 eager", "speed-up"],
                   [[r.batch, spread(r.ours_tokens_per_s), spread(r.eager_tokens_per_s), ratio(r.decode_speedup),
                     "yes" if r.decode_identical_tokens else "**no**", spread(r.ours_int8_tokens_per_s),
                     spread(r.eager_int8_tokens_per_s), ratio(r.decode_int8_speedup)] for r in traced])
    graphed = [r for r in res.results if r.graph_tokens_per_s is not None]
    if graphed:
        page.add("Decode steps replayed as one captured CUDA graph (`sample.py --decode cuda-graph`), against our "
                 "eager decoding in the same run:\n")
        page.table(["batch", "CUDA graph new tokens/s", "over eager", "tokens identical to eager"],
                   [[r.batch, spread(r.graph_tokens_per_s), f"{r.graph_speedup:.2f}x",
                     "yes" if r.graph_identical_tokens else "**no**"] for r in graphed])
    else:
        page.add("The CUDA-graph decoding (`--decode cuda-graph`) is measured only on a CUDA device.\n")


EXPERIMENT = Experiment(
    name="generate_speed", title="Decoding against ONNX Runtime, llama.cpp and transformers", about=__doc__,
    settings=Settings,
    quick=Settings(new_tokens=32, repeats=3), full=Settings(),
    result=GenerateSpeed, measure=measure, plot=plot, section=section,
    gpu=Settings(new_tokens=256, repeats=5))
