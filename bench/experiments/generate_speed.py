"""Generation speed against Hugging Face transformers on the same weights, in the same run.

    pip install transformers                          # the comparison's only extra dependency
    python -m bench.experiments generate_speed        # GPT-2 124M config, random weights, 32-token prompt,
                                                      # 64 new tokens, greedy, batches 1 and 12

Both sides decode greedily with a KV cache from identical weights; repeats are interleaved (the order
alternates) so that machine noise hits both alike, and the speed-up is the median of per-repeat ratios.
The tokens generated are checked to be identical.  Without transformers installed, our generate() is
measured alone.  On a CUDA device our decoding is also timed with its decode steps replayed as one captured
CUDA graph (`decode="cuda-graph"`, model/decode_graph.py), in the same interleaved repeats.
"""
from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiment import Experiment, SettingsError, at_least
from bench.record import plt
from bench.report_page import Page, spread
from model.config import PRESETS, preset
from model.generate import generate
from model.gpt import GPT
from model.hf import export_hf_gpt2
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
    device: str = option("auto", "auto, cpu, cuda, ...")

    def __post_init__(self):
        at_least(self, 1, "prompt_tokens", "new_tokens", "repeats", "batch_sizes")


@dataclass
class GenerationRow:
    batch: int
    ours_tokens_per_s: Spread
    hf_tokens_per_s: Spread | None = None  # None: transformers is not installed
    speedup: float | None = None  # ours over transformers
    identical_tokens: bool | None = None
    # On CUDA: decode steps replayed as one captured CUDA graph (model/decode_graph.py); None elsewhere.
    graph_tokens_per_s: Spread | None = None
    graph_speedup: float | None = None  # over our eager decoding
    graph_identical_tokens: bool | None = None


@dataclass
class GenerateSpeed:
    model: str
    prompt_tokens: int
    new_tokens: int
    transformers: str | None  # its version; None when not installed
    results: list[GenerationRow]
    environment: Environment


def hf_model(ours: GPT, device: torch.device):
    """transformers' GPT2LMHeadModel with our weights, or None when transformers is not installed."""
    try:
        import transformers
    except ImportError:
        print("transformers is not installed (pip install transformers): measuring our generate() alone",
              file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory() as tmp:
        export_hf_gpt2(ours, tmp)
        return transformers.GPT2LMHeadModel.from_pretrained(tmp).to(device).eval()


def measure(settings: Settings, work_dir: Path) -> GenerateSpeed:
    device = choose_device(settings.device)
    torch.manual_seed(0)
    ours = GPT(preset(settings.model)).to(device).eval()
    if settings.prompt_tokens + settings.new_tokens > ours.config.block_size:
        raise SettingsError(f"--prompt-tokens + --new-tokens exceed the {settings.model} context of "
                            f"{ours.config.block_size}")
    theirs = hf_model(ours, device)
    params = SamplingParams(max_new_tokens=settings.new_tokens, temperature=0, stop_at_eot=False)
    rows = []
    for batch in settings.batch_sizes:
        prompt = torch.randint(0, ours.config.vocab_size, (batch, settings.prompt_tokens), device=device)

        def run_theirs():
            with torch.inference_mode():
                return theirs.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                       max_new_tokens=settings.new_tokens, min_new_tokens=settings.new_tokens,
                                       pad_token_id=EOT, use_cache=True)

        calls = {"ours": lambda: generate(ours, prompt, params), **({"theirs": run_theirs} if theirs else {})}
        if device.type == "cuda":
            calls["graph"] = lambda: generate(ours, prompt, params, decode="cuda-graph")
        seconds = time_interleaved(calls, settings.repeats, warmup=1, device=device, alternate=True)
        new = batch * settings.new_tokens
        row = GenerationRow(batch, Spread.of([new / t for t in seconds["ours"]]))
        if "graph" in calls:
            row.graph_tokens_per_s = Spread.of([new / t for t in seconds["graph"]])
            row.graph_speedup = paired_ratio(seconds["ours"], seconds["graph"])
            row.graph_identical_tokens = bool(torch.equal(calls["graph"](), generate(ours, prompt, params)))
        if theirs:
            row.hf_tokens_per_s = Spread.of([new / t for t in seconds["theirs"]])
            row.speedup = paired_ratio(seconds["theirs"], seconds["ours"])
            row.identical_tokens = bool(torch.equal(generate(ours, prompt, params), run_theirs()))
        rows.append(row)
        print(f"batch {batch:>2}: ours {row.ours_tokens_per_s.median:7.1f} new tokens/s"
              + (f", with a CUDA graph {row.graph_tokens_per_s.median:7.1f} (tokens identical: "
                 f"{row.graph_identical_tokens})" if row.graph_tokens_per_s else "")
              + (f", transformers {row.hf_tokens_per_s.median:7.1f}, speedup {row.speedup:.2f}x, identical "
                 f"tokens: {row.identical_tokens}" if theirs else ""))
    version = sys.modules["transformers"].__version__ if theirs else None
    return GenerateSpeed(settings.model, settings.prompt_tokens, settings.new_tokens, version, rows,
                         environment(device))


def plot(result: GenerateSpeed):
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(result.results))
    ax.bar([x - 0.2 for x in xs], [r.ours_tokens_per_s.median for r in result.results], width=0.4, label="ours")
    if result.transformers:
        ax.bar([x + 0.2 for x in xs], [r.hf_tokens_per_s.median for r in result.results], width=0.4,
               label=f"transformers {result.transformers}")
    ax.set_xticks(list(xs), [f"batch {r.batch}" for r in result.results])
    ax.set_ylabel("new tokens / s")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    ax.set_title(f"{result.model}: {result.prompt_tokens}-token prompt, {result.new_tokens} new tokens, greedy")
    return fig


def section(res: GenerateSpeed, page: Page) -> None:
    page.add(f"`{res.model}` with random weights, {res.prompt_tokens}-token prompts, {res.new_tokens} new tokens, "
             f"greedy with a KV cache"
             + (f"; against transformers {res.transformers} on the same weights, interleaved.\n" if res.transformers
                else "; transformers was not installed, so ours alone.\n"))
    page.table(["batch", "ours new tokens/s", "transformers new tokens/s", "speedup", "identical tokens"],
               [[r.batch, spread(r.ours_tokens_per_s), spread(r.hf_tokens_per_s),
                 "n/a" if r.speedup is None else f"{r.speedup:.2f}x",
                 "n/a" if r.identical_tokens is None else "yes" if r.identical_tokens else "**no**"]
                for r in res.results])
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
    name="generate_speed", title="Generation against transformers", about=__doc__, settings=Settings,
    quick=Settings(new_tokens=32, repeats=3), full=Settings(),
    result=GenerateSpeed, measure=measure, plot=plot, section=section,
    gpu=Settings(new_tokens=256, repeats=5))
