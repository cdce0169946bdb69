"""Decoding speed against the runtimes a CPU user would pick, on the same weights, each set up as its own docs
recommend: ONNX Runtime in fp32 and int8 through its GPT-2 converter, optimizer and IO binding
(bench/peers/onnx_peer.py), llama.cpp in F32 and Q8_0 through its C API, several sequences in one context
(bench/peers/llama_cpp_peer.py), and Hugging Face transformers' generate(), each when installed; quiet, and on a
slowed host: one core kept busy by another process, a co-running memory-bandwidth load (bench/peers/colocated.py),
and every side on one core with one thread (as `taskset -c 0`).  Every row records the host's memory read rate and
float32 matmul rate measured under its condition (bench/peers/host_rates.py), so that a ratio from a slow or shared
host reads as such.

    pip install onnxruntime onnx "transformers==4.44.2"  # the peers, each optional (onnx_peer.py says why 4.44)
    pip install gguf llama-cpp-python                    # builds llama.cpp from source: 4.5 min on 2 cores
    python -m bench.experiments generate_speed           # GPT-2 124M config, random weights, 32-token English
                                                         # prompts, 128 new tokens, greedy, batches 1, 4 and 12,
                                                         # quiet, one core busy, memory load, one core

Ours is `generate()` on the model as sample.py runs it: float32 linears packed for oneDNN
(model/packed_linear.py), and the int8 artifact's model (model/int8.py) with the tied embedding / output head
in int8 too (`quantize/dynamic.py --head int8`; `--int8-head` picks another format), as llama.cpp's Q8_0
quantizes GPT-2's tied token-embedding / output matrix; its decode steps as `--decode` says (auto: what
generate() picks), and the same steps eager beside them.

Every side runs in a process of its own, kept loaded (bench/peers/decode_sides.py), and is called in turns whose
order reverses every other round, so that machine noise hits all alike and no runtime's threads or caches are in
another's way. A side's first call is untimed (our traces, ONNX Runtime's and llama.cpp's first allocations);
then each round times a one-token call (the prompt's prefill and the first token) and a whole call: end-to-end
new tokens/s, and decode-only tokens/s (the tokens after the first over the time after the first). Each ratio is
the median of per-round ratios; the 1-minute load average is recorded as each round begins.  On a slowed host,
the load runs through that condition's rounds (the one-core rows restart every side pinned), and our eager sides are
left out (they show what tracing
gains, which the quiet rounds show). The fp32 tokens of
every peer are compared with ours; the int8 sides are compared with our fp32 tokens (agreement: the share of
equal new tokens).

Effective bandwidth at batch 1: the bytes of the matrices a decoding step reads (block linears, layer norms
and the output head; not the one embedding row per token) times the decode-only steps per second, against the
machine's read bandwidth measured in the same run with the sides idle (a sum over 1 GiB of float32, 5 before
and 5 after the rounds). On a CUDA device our default decoding is one captured CUDA graph per step
(decode/cuda_graph.py), timed beside the eager steps.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiment import Experiment, RandomWeightsSettings, SettingsError
from bench.peers.colocated import colocated
from bench.peers.decode_sides import Sides, SideSpec
from bench.peers.host_rates import HostRates, measure_in_process, read_bandwidth
from bench.processes import run_command
from bench.plots import finish, grouped_bars, plt
from bench.report_page import Page, decode_path, spread
from data.corpus import builtin_documents
from data.tokenizer import encode
from model.config import preset
from decode.steps import DECODE_MODES, fastest_decode
from model.gpt import GPT
from model.int8 import HEAD_FORMATS
from runtime.cli import option
from runtime.device import choose_device
from runtime.progress import ProgressBar
from runtime.provenance import provenance
from runtime.timing import Environment, Spread, environment, paired_ratio
from storage.artifact import save_artifact
from storage.export import export_hf_gpt2


SLOWED = ("memory-load", "one-core", "none")


@dataclass
class Settings(RandomWeightsSettings):
    prompt_tokens: int = option(32, "prompt length (English text: the built-in corpus's validation split)", min=1)
    # the decode-only rate is that of the tokens after the first
    new_tokens: int = option(128, "tokens generated per row", min=2)
    batch_sizes: list[int] = option([1, 4, 12], "rows generated together", min=1)
    busy_cores: list[int] = option([0, 1], "cores kept busy by another process while the sides run (a Python "
                                           "loop each, bench/peers/colocated.py): 0 is a quiet machine", min=0)
    slowed: list[str] = option(["memory-load", "one-core"], "slowed-host rows after those: one-core (every side on "
                                                             "core 0 with 1 thread, as taskset -c 0), memory-load (a "
                                                             "co-running memory-bandwidth load, "
                                                             "bench/workloads/memory_stream.py), none", choices=SLOWED)
    repeats: int = option(5, "timed repeats of each side (interleaved)", min=1)
    onnx: bool = option(True, "time ONNX Runtime beside ours when onnxruntime is installed (its export takes "
                              "about a minute for GPT-2 124M)")
    llama_cpp: bool = option(True, "time llama.cpp F32 and Q8_0 beside ours when llama-cpp-python and gguf are "
                                   "installed")
    int8_head: str = option("int8", "head format of our int8 model (quantize/dynamic.py --head): int8 matches "
                                    "llama.cpp's Q8_0, which quantizes the tied output matrix too",
                            choices=HEAD_FORMATS)
    fp16_head_too: bool = option(False, "also time our int8 model with an fp16 head (quantize/dynamic.py --head "
                                        "fp16) in the same rounds, to compare the head formats")
    transformers: bool = option(True, "time Hugging Face transformers beside ours when it is installed")
    decode: str = option("auto", "how our decode steps run (sample.py --decode; auto: its default)",
                         choices=DECODE_MODES)
    baseline: str | None = option(None, "a git revision of this project whose generate() runs too, fp32 and int8, "
                                        "in the same interleaved rounds: an A/B of a change (none: not run)")
    device: str = option("auto", "auto, cpu, cuda, ...")

    def __post_init__(self):
        super().__post_init__()
        if self.baseline is not None:
            # Named to git as a commit, never as an option: a leading "-" is refused before git sees it.
            found = None if self.baseline.startswith("-") else run_command(
                ["git", "rev-parse", "--verify", "--quiet", f"{self.baseline}^{{commit}}"])
            if found is None or not found.ok:
                raise SettingsError(f"--baseline {self.baseline!r} is not a commit of this repository; give a "
                                    f"revision `git log` shows (a hash, a branch, HEAD~1)")


@dataclass
class SideSpeed:
    """One side (a runtime and format) at one batch size."""
    tokens_per_s: Spread  # new tokens / s, the prompt's prefill included (end to end)
    # the tokens after the first / the time after the first: decode steps alone; None when a round's one-token call
    # took as long as its whole call (the decode steps are within the timing's noise: see `decode_seconds`)
    decode_tokens_per_s: Spread | None
    first_token_s: Spread  # the prompt's prefill and the first new token
    identical_tokens: bool  # its tokens are our fp32 side's
    token_agreement: float  # the share of its new tokens equal to our fp32 side's


@dataclass
class Comparison:
    """`side` over `against` at one batch size: the median over rounds of against's time / side's time."""
    side: str
    against: str
    end_to_end: float
    decode_only: float | None  # None when either side's decode time is not measured (SideSpeed)


@dataclass
class GenerationRow:
    batch: int
    busy_cores: int  # cores kept busy by another process while this row's rounds ran
    host: str  # the condition: quiet, N busy core(s), memory load, one core
    host_rates: HostRates | None  # the host's read and matmul rates under it (CPU runs)
    sides: dict[str, SideSpeed]
    comparisons: list[Comparison]
    load_average: list[float]  # the 1-minute load average as each timed round began

    def ratio(self, side: str, against: str) -> Comparison | None:
        return next((c for c in self.comparisons if (c.side, c.against) == (side, against)), None)


@dataclass
class Bandwidth:
    """Batch 1: the weight bytes one decoding step reads, and each side's rate of reading them in its decode
    steps (the decode-only rate: a step reads every weight once)."""
    read_gb_per_s: Spread  # the machine's, measured in this run (before and after the timed rounds)
    fp32_step_bytes: int
    int8_step_bytes: int | None
    gb_per_s: dict[str, float]  # side -> weight bytes x decode-only tokens/s / 1e9
    share_of_read: dict[str, float]


@dataclass
class GenerateSpeed:
    model: str
    prompt_tokens: int
    new_tokens: int
    prompts: str  # where the prompts' tokens come from
    linear_kernels: str  # what pack_for_inference did to our fp32 model
    decode: str  # how our decode steps ran (decode/steps.py's DECODE_MODES)
    int8_head: str | None
    versions: dict[str, str]  # runtime -> its version, for every runtime measured
    setups: dict[str, str]  # peer runtime -> how it was set up (converter, optimizer, API, threads)
    results: list[GenerationRow]
    bandwidth: Bandwidth | None
    environment: Environment


TRANSFORMERS_SETUP = "GPT2LMHeadModel.generate(do_sample=False, use_cache=True), its default attention, inference mode"

# The pairs compared at every batch size both sides ran: our side first.
COMPARED = (("ours fp32", "ONNX Runtime fp32"), ("ours fp32", "llama.cpp F32"), ("ours int8", "ONNX Runtime int8"),
            ("ours int8", "llama.cpp Q8_0"), ("ours fp32", "transformers"), ("ours fp32", "ours fp32 eager"),
            ("ours int8", "ours int8 eager"), ("ours int8", "ours int8 fp16 head"))


def checkout(revision: str, folder: Path) -> Path:
    """This project's files at `revision` (git archive, no git metadata touched), in `folder`, made afresh."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    archive = run_command(["git", "archive", "--format=tar", revision, "-o", str(folder / "source.tar")])
    if not archive.ok:
        raise SettingsError(f"--baseline {revision!r}: git archive failed: {archive.output.strip()}")
    with tarfile.open(folder / "source.tar") as tar:
        tar.extractall(folder, filter="data")
    return folder


def compared(settings: Settings) -> list[tuple[str, str]]:
    """The pairs compared at every batch size both sides ran: our side first; with a baseline, ours against it."""
    if not settings.baseline:
        return list(COMPARED)
    return [*COMPARED, *((f"ours {kind}", f"ours {kind} at {settings.baseline}") for kind in ("fp32", "int8"))]


def real_prompts(rows: int, length: int) -> torch.Tensor:
    """`rows` prompts of `length` tokens of English: consecutive windows of the built-in corpus's validation
    text (data/corpus.py), the same in every run."""
    tokens: list[int] = []
    for document in builtin_documents("validation"):
        tokens += encode(document)
        if len(tokens) >= rows * length:
            return torch.tensor(tokens[:rows * length]).view(rows, length)
    raise SettingsError(f"the built-in validation text has fewer than {rows} x {length} tokens")


def installed(*modules: str) -> bool:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(f"{', '.join(missing)} not installed: the side that needs it is not measured (this module's "
              f"docstring says what to install)", file=sys.stderr)
    return not missing


def side_specs(model: GPT, settings: Settings, device: torch.device, decode: str, work_dir: Path) -> list[SideSpec]:
    """Every side to time, with the files it loads written here once: our artifact, the ONNX graphs, the GGUF
    files, the Hugging Face folder (each peer when installed and asked for)."""
    threads, cpu = torch.get_num_threads(), device.type == "cpu"
    ours = work_dir.resolve() / "ours"
    save_artifact(ours, model, model.config, "float", provenance("generate_speed"))
    run = lambda name, **kw: SideSpec(name, "ours", (str(ours),), threads, str(device), **kw)
    specs = [run("ours fp32", decode=decode)]
    if cpu:
        specs.append(run("ours int8", decode=decode, int8_head=settings.int8_head))
    if settings.baseline:
        root = str(checkout(settings.baseline, work_dir.resolve() / "baseline"))
        specs.append(run(f"ours fp32 at {settings.baseline}", decode=decode, root=root))
        if cpu:
            specs.append(run(f"ours int8 at {settings.baseline}", decode=decode, int8_head=settings.int8_head,
                             root=root))
        if settings.fp16_head_too:
            specs.append(run("ours int8 fp16 head", decode=decode, int8_head="fp16"))
    if decode != "dynamic":
        specs.append(run("ours fp32 eager"))
        if cpu:
            specs.append(run("ours int8 eager", int8_head=settings.int8_head))
    if settings.onnx and cpu and installed("onnxruntime", "onnx", "transformers"):
        print("converting the model with ONNX Runtime's GPT-2 converter and optimizer", file=sys.stderr, flush=True)
        from bench.peers.onnx_peer import ort_files
        for name, graph in ort_files(model, work_dir / "onnx").items():
            specs.append(SideSpec(f"ONNX Runtime {name}", "onnxruntime", (str(graph),), threads))
    if settings.llama_cpp and cpu and installed("llama_cpp", "gguf"):
        print("writing the model as GGUF and quantizing it with llama.cpp", file=sys.stderr, flush=True)
        from bench.peers.llama_cpp_peer import gguf_files
        context = settings.prompt_tokens + settings.new_tokens
        for name, path in gguf_files(model, work_dir / "gguf").items():
            specs.append(SideSpec(f"llama.cpp {name}", "llama.cpp", (str(path),), threads, context=context,
                                  rows=max(settings.batch_sizes)))
    if settings.transformers and installed("transformers"):
        export_hf_gpt2(model, work_dir / "hf")
        specs.append(SideSpec("transformers", "transformers", (str(work_dir / "hf"),), threads, str(device)))
    return specs


def time_rounds(sides: Sides, names: list[str], prompt: torch.Tensor, new_tokens: int, repeats: int):
    """Each side's tokens (from an untimed first call), and per round the seconds of a one-token call (the
    prefill and the first token) and of a `new_tokens` call, the sides in turns whose order reverses every other
    round; the load average as each round began."""
    tokens = {name: sides.generate(name, prompt, new_tokens)[1] for name in names}  # warm-up: traces, caches
    first: dict[str, list[float]] = {name: [] for name in names}
    whole: dict[str, list[float]] = {name: [] for name in names}
    loads = []
    for round_ in ProgressBar(range(repeats), desc=f"batch {prompt.size(0)}", unit="round", leave=False):
        loads.append(os.getloadavg()[0])
        for name in names[::-1] if round_ % 2 else names:
            first[name].append(sides.generate(name, prompt, 1)[0])
            whole[name].append(sides.generate(name, prompt, new_tokens)[0])
    return tokens, first, whole, loads


def agreement(reference: torch.Tensor, candidate: torch.Tensor, prompt_tokens: int) -> float:
    return float((reference[:, prompt_tokens:] == candidate[:, prompt_tokens:]).float().mean())


@dataclass(frozen=True)
class Condition:
    """A state of the host while rows are timed."""
    name: str
    busy_cores: int = 0  # busy Python loops beside the sides
    memory_streams: int = 0  # memory-bandwidth loads beside the sides
    cpus: tuple[int, ...] = ()  # the cores every side is pinned to, with one thread each; () all, as set up

    @property
    def quiet(self) -> bool:
        return self == Condition("quiet")


def conditions(settings: Settings) -> list[Condition]:
    found = [Condition("quiet" if n == 0 else f"{n} busy core{'s' * (n > 1)}", busy_cores=n)
             for n in settings.busy_cores]
    if "memory-load" in settings.slowed:
        found.append(Condition("memory load", memory_streams=1))
    if "one-core" in settings.slowed:
        found.append(Condition("one core", cpus=(0,)))
    return found


def time_row(sides: Sides, names: list[str], condition: Condition, rates: HostRates | None, prompt: torch.Tensor,
             settings: Settings) -> GenerationRow:
    batch = prompt.size(0)
    tokens, first, whole, loads = time_rounds(sides, names, prompt, settings.new_tokens, settings.repeats)
    new, later = batch * settings.new_tokens, batch * (settings.new_tokens - 1)
    decode_s = {name: decode_seconds(whole[name], first[name]) for name in names}
    reference = tokens["ours fp32"]
    speeds = {name: SideSpeed(Spread.of([new / t for t in whole[name]]),
                              None if decode_s[name] is None else Spread.of([later / t for t in decode_s[name]]),
                              Spread.of(first[name]), bool(torch.equal(tokens[name], reference)),
                              agreement(reference, tokens[name], settings.prompt_tokens)) for name in names}
    comparisons = [Comparison(side, against, paired_ratio(whole[against], whole[side]),
                              None if decode_s[side] is None or decode_s[against] is None
                              else paired_ratio(decode_s[against], decode_s[side]))
                   for side, against in compared(settings) if side in speeds and against in speeds]
    row = GenerationRow(batch, condition.busy_cores, condition.name, rates, speeds, comparisons, loads)
    print(f"batch {batch:>2}, {condition.name}{host_note(rates)}, new tokens/s end to end (decode only): " + ", ".join(
        f"{name} {s.tokens_per_s.median:.1f} ({rate(s.decode_tokens_per_s)})"
        for name, s in speeds.items()) + f"; load average {min(loads):.2f}-{max(loads):.2f}", flush=True)
    if any(s.decode_tokens_per_s is None for s in speeds.values()):
        print(f"batch {batch:>2}, {condition.name}: {NOT_MEASURED}", flush=True)
    return row


# Why a side's decode-only figure is missing (SideSpeed), said once per row where it is.
NOT_MEASURED = ("decode only n/a: in a round, the one-token call took as long as the whole call, so the decode "
                "steps' time is within the timing's noise; ask for more --new-tokens to time them")


def decode_seconds(whole: list[float], first: list[float]) -> list[float] | None:
    """Each round's time after the first token: its whole call's less its one-token call's (two calls, timed
    apart).  None when a round's difference is not positive: its decode steps took less than the two calls'
    noise, and a rate from it would be negative or unbounded."""
    after = [w - f for w, f in zip(whole, first, strict=True)]
    return after if min(after) > 0 else None


def rate(spread: Spread | None) -> str:
    return "n/a" if spread is None else f"{spread.median:.1f}"


def host_note(rates: HostRates | None) -> str:
    return "" if rates is None else (f" (host: read {rates.read_gb_per_s:.1f} GB/s, matmul "
                                     f"{rates.matmul_gflop_per_s:.0f} GFLOP/s with {rates.threads} thread(s))")


def batch1_bandwidth(rows: list[GenerationRow], sides: Sides, read: Spread) -> Bandwidth | None:
    one = next((r for r in rows if r.batch == 1 and r.host == "quiet"), None)
    if one is None:
        return None
    step = {name: about["step_bytes"] for name, about in sides.about.items() if "step_bytes" in about}
    # Every fp32 side reads the same tensors (llama.cpp's head has 50,257 rows, not our padded 50,304: 0.1% fewer
    # bytes); the int8 peers' formats differ from ours, so only ours is counted.
    sizes = {name: step["ours fp32"] for name in ("ours fp32", "ONNX Runtime fp32", "llama.cpp F32") if name in one.sides}
    if "ours int8" in step:
        sizes["ours int8"] = step["ours int8"]
    gb = {name: one.sides[name].decode_tokens_per_s.median * size / 1e9 for name, size in sizes.items()
          if one.sides[name].decode_tokens_per_s is not None}
    print(f"read bandwidth {read.median:.1f} GB/s ({read.min:.1f}-{read.max:.1f}); at batch 1, decode steps: "
          + ", ".join(f"{name} {v:.1f} GB/s ({v / read.median:.0%})" for name, v in gb.items()), flush=True)
    return Bandwidth(read, step["ours fp32"], step.get("ours int8"), gb, {name: v / read.median for name, v in gb.items()})


def measure(settings: Settings, work_dir: Path) -> GenerateSpeed:
    device = choose_device(settings.device)
    torch.manual_seed(0)
    model = GPT(preset(settings.model)).eval()
    if settings.prompt_tokens + settings.new_tokens > model.config.block_size:
        raise SettingsError(f"--prompt-tokens + --new-tokens exceed the {settings.model} context of "
                            f"{model.config.block_size}")
    decode = fastest_decode(model, device) if settings.decode == "auto" else settings.decode
    prompts = real_prompts(max(settings.batch_sizes), settings.prompt_tokens)
    specs = side_specs(model, settings, device, decode, Path(work_dir))
    del model  # each side loads its own copy
    cpu = device.type == "cpu"
    every = conditions(settings) if cpu else [Condition("quiet")]
    rows, bandwidth, about = [], None, None
    # The pinned conditions run on sides started pinned, after the others' sides have ended (two sets of loaded
    # runtimes at once would not fit a small host's memory).
    for group in ([c for c in every if not c.cpus], [c for c in every if c.cpus]):
        if not group:
            continue
        cpus = group[0].cpus
        group_specs = [dataclasses.replace(spec, threads=1, cpus=cpus) for spec in specs] if cpus else specs
        print(f"starting {len(specs)} sides, each in its own process{f' on cores {cpus}' if cpus else ''}: "
              f"{', '.join(s.name for s in specs)}", file=sys.stderr, flush=True)
        with Sides(group_specs) as sides:
            about = about or sides.about
            read_before = read_bandwidth() if cpu and not cpus else []  # the sides wait, idle, on their pipes
            for condition in group:
                names = [s.name for s in specs if condition.quiet or not s.name.endswith(" eager")]
                with colocated("busy_loop", condition.busy_cores), colocated("memory_stream",
                                                                             condition.memory_streams):
                    rates = measure_in_process(group_specs[0].threads, list(cpus)) if cpu else None
                    rows += [time_row(sides, names, condition, rates, prompts[:batch], settings)
                             for batch in settings.batch_sizes]
            if read_before:
                bandwidth = batch1_bandwidth(rows, sides, Spread.of(read_before + read_bandwidth()))
    versions = {spec.runtime: about[spec.name]["version"] for spec in specs if spec.runtime != "ours"}
    return GenerateSpeed(settings.model, settings.prompt_tokens, settings.new_tokens,
                         "the built-in corpus's validation text (Python's documentation), consecutive windows",
                         about["ours fp32"]["kernels"], decode, settings.int8_head if cpu else None,
                         {"torch": torch.__version__, **versions}, peer_setups(versions), rows, bandwidth,
                         environment(device))


def peer_setups(versions: dict[str, str]) -> dict[str, str]:
    """How each peer that ran was set up, from the module that set it up."""
    setups = {}
    if "onnxruntime" in versions:
        from bench.peers.onnx_peer import SETUP
        setups["onnxruntime"] = SETUP
    if "llama.cpp" in versions:
        from bench.peers.llama_cpp_peer import SETUP
        setups["llama.cpp"] = SETUP
    if "transformers" in versions:
        setups["transformers"] = TRANSFORMERS_SETUP
    return setups


def plot(result: GenerateSpeed):
    order = ["ours fp32", "ONNX Runtime fp32", "llama.cpp F32", "ours int8", "ours int8 fp16 head",
             "ONNX Runtime int8", "llama.cpp Q8_0", "transformers"]
    present = list(dict.fromkeys(name for r in result.results for name in r.sides))
    names = [n for n in order if n in present] + [n for n in present if n not in order and "eager" not in n]
    hosts = list(dict.fromkeys(r.host for r in result.results))
    batches = sorted({r.batch for r in result.results})
    fig, axes = plt.subplots(len(hosts), len(batches), figsize=(5 * len(batches), 3.8 * len(hosts)), squeeze=False)
    for row in result.results:
        ax = axes[hosts.index(row.host)][batches.index(row.batch)]
        sides = [row.sides.get(n) for n in names]
        groups = {"end to end": [s and s.tokens_per_s for s in sides],
                  "decode steps only": [s and s.decode_tokens_per_s for s in sides]}
        drawn = grouped_bars(ax, names, groups)
        for bars, values in zip(drawn.values(), groups.values()):
            ax.bar_label(bars, labels=[f"{b.get_height():.0f}" if value else "not run" if s is None else "n/a"
                                       for b, s, value in zip(bars, sides, values)], fontsize=7)
        ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=8)
        ax.set_title(f"batch {row.batch}, {row.host}" + ("" if row.host_rates is None else
                     f" (read {row.host_rates.read_gb_per_s:.0f} GB/s, {row.host_rates.matmul_gflop_per_s:.0f} "
                     f"GFLOP/s)"), fontsize=9)
        ax.set_ylabel("new tokens / s")
    axes[0][0].legend(fontsize=8)
    return finish(fig, axes.flat, f"{result.model}: {result.prompt_tokens}-token prompts, {result.new_tokens} new "
                                  f"tokens, greedy, each runtime in its own process", grid="y")


def side_path(name: str, decode: str) -> str:
    """The decode path a side of this experiment ran: ours with the decode steps it was given (eager ones as
    `dynamic`), a peer its own way."""
    if not name.startswith("ours"):
        return "the peer's own, set up as its docs advise"
    return decode_path("dynamic" if name.endswith(" eager") else decode)


def section(res: GenerateSpeed, page: Page) -> None:
    versions = ", ".join(f"{name} {v}" for name, v in res.versions.items())
    page.add(f"`{res.model}` with random weights; {res.prompt_tokens}-token prompts from {res.prompts}; "
             f"{res.new_tokens} new tokens, greedy with a KV cache. Each runtime runs in a process of its own, kept "
             f"loaded, and the sides are called in turns (the order reversed every other round): per round, a "
             f"one-token call (the prompt's prefill and the first token) and a {res.new_tokens}-token call. End to "
             f"end: new tokens / the whole call; decode only: the tokens after the first / the time after the "
             f"first token. Medians and ranges over the rounds; each ratio is the median of per-round ratios. "
             f"Ours: {res.linear_kernels}, decode steps {res.decode}"
             + (f", int8 with the {res.int8_head} head" if res.int8_head else "")
             + "".join(f"; {runtime}: {setup}" for runtime, setup in res.setups.items())
             + f". Versions: {versions}.\n")
    page.add(f"**Warm-ups:** not overlapped: the sides' processes load together, then each side makes its untimed "
             f"first call at each batch size alone, one side after another (ours also waits there for its weights "
             f"to move onto huge pages); the **path timed** column says which decode path each side ran (generate_"
             f"speed passes `auto`'s pick for this device, {res.decode}, as a fixed mode, so it times none of the "
             f"default's run-time choices: bench/experiments/user_start.py times the user's default).\n")
    for row in res.results:
        page.add(f"Batch {row.batch}, {row.host}{host_note(row.host_rates)} (1-minute load average as the rounds began: "
                 f"{', '.join(f'{v:.2f}' for v in row.load_average)}):\n")
        page.table(["side", "path timed", "new tokens/s end to end", "decode only", "first token (s)",
                    "tokens = ours fp32"],
                   [[name, side_path(name, res.decode), spread(s.tokens_per_s), spread(s.decode_tokens_per_s),
                     spread(s.first_token_s, 3), "yes" if s.identical_tokens else f"no ({s.token_agreement:.0%} agree)"]
                    for name, s in row.sides.items()])
        if row.comparisons:
            page.table(["ours", "against", "speed-up end to end", "decode only"],
                       [[c.side, c.against, f"{c.end_to_end:.2f}x",
                         "n/a" if c.decode_only is None else f"{c.decode_only:.2f}x"] for c in row.comparisons])
        if any(s.decode_tokens_per_s is None for s in row.sides.values()):
            page.add(f"{NOT_MEASURED}.\n")
    if res.bandwidth:
        b = res.bandwidth
        page.add(f"Batch 1 decode steps against the machine's read bandwidth, {spread(b.read_gb_per_s)} GB/s (sums "
                 f"over 1 GiB before and after the timed rounds, with the sides idle); a step reads "
                 f"{b.fp32_step_bytes / 1e6:,.0f} MB of weights in fp32"
                 + (f" and {b.int8_step_bytes / 1e6:,.0f} MB in our int8" if b.int8_step_bytes else "") + ":\n")
        page.table(["side", "GB/s", "share of read bandwidth"],
                   [[name, f"{v:.1f}", f"{b.share_of_read[name]:.0%}"] for name, v in b.gb_per_s.items()])
    if res.environment.device_type != "cuda":
        page.add("The CUDA-graph decoding (`--decode cuda-graph`) is measured only on a CUDA device.\n")


EXPERIMENT = Experiment(
    name="generate_speed", title="Decoding against ONNX Runtime, llama.cpp and transformers", about=__doc__,
    settings=Settings,
    quick=Settings(new_tokens=32, repeats=3, busy_cores=[0], slowed=["none"]), full=Settings(),
    result=GenerateSpeed, measure=measure, plot=plot, section=section,
    gpu=Settings(new_tokens=256, repeats=5))
