"""Compression: prune/'s loss-against-sparsity curves and quantize/'s float-against-int8 table.

    python -m bench.experiments compression --checkpoint out/bench/train      # runs prune/ and quantize/ on it
    python -m bench.experiments compression --prune-report out/prune/prune_report.json \
        --quant-report out/int8/quant_report.json                              # gathers reports already written

Either runs `prune/iterative.py` (one run per --methods, into one folder) and `quantize/dynamic.py`
on the checkpoint, or gathers reports they already wrote; then puts their figures side by side in
one result and one plot.  The measuring is theirs: see prune/ and quantize/.  The int8 artifact is
left in the work folder (`int8/`), where bench/run_all.py scores it.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.experiment import Experiment, ExperimentError, ExperimentSettings
from bench.plots import finish, grouped_bars, plt
from bench.report_page import Page, num
from bench.processes import ROOT, STDOUT, run_command
from runtime.cli import option
from runtime.device import choose_device
from runtime.timing import Environment, environment
from storage.run_folder import default_checkpoint

PRUNE_REPORT = "prune_report.json"
QUANT_REPORT = "quant_report.json"
METHODS = ("magnitude", "row", "wanda")


@dataclass
class Settings(ExperimentSettings):
    checkpoint: str | None = option(None, "float artifact to compress (default: the "
                                          "train.py checkpoint under out/ trained longest)")
    prune_report: str | None = option(None, "gather this prune_report.json instead of "
                                            "running prune/")
    quant_report: str | None = option(None, "gather this quant_report.json instead of "
                                            "running quantize/")
    dataset: str = option("builtin", "validation text for both tools")
    methods: list[str] = option(["magnitude", "row"], "pruning methods, one prune/ run each", choices=METHODS)
    target: float = option(0.5, "final sparsity of the pruning runs")
    rounds: int = option(3, "pruning rounds", min=1)
    finetune_steps: int = option(20, "fine-tuning steps after each round", min=0)
    batch_size: int = option(8, "prune/: fine-tuning and evaluation batch", min=1)
    block_size: int | None = option(None, "prune/: fine-tuning and evaluation context", min=1)
    eval_batches: int = option(8, "validation batches for both tools", min=1)
    speed_repeats: int = option(3, "timed repeats for both tools", min=1)
    new_tokens: int = option(32, "both tools: tokens per timed generation", min=1)
    speed_seq_len: int = option(128, "prune/: length of the timed forward passes", min=1)
    timeout_s: float = option(900, "per tool run", min=1)


@dataclass
class EvalSettings:
    split: str
    batches: int
    batch_size: int
    block_size: int


@dataclass
class DenseControl:
    finetune_steps: int
    val_loss: float
    time_s: float


@dataclass
class PruneRound:
    sparsity: float
    val_loss: float
    val_loss_after_pruning: float | None  # None in round 0 (nothing pruned)
    parameters: int
    nonzero_parameters: int
    forward_speedup: float
    generation_speedup: float


@dataclass
class PruneCurve:
    finetune_steps: int
    dataset: str
    eval: EvalSettings
    dense_control: DenseControl | None
    rounds: list[PruneRound]


@dataclass
class FloatInt8:
    float: float
    int8: float
    change_pct: float | None = None  # val_loss only
    speedup: float | None = None  # tokens/s only


@dataclass
class Quantization:
    val_loss: FloatInt8
    next_token_agreement: float
    tokens_per_s: dict[str, FloatInt8]  # by "batch B"
    generation_settings: dict[str, int]
    size_bytes: FloatInt8  # change: int8 / float
    size_ratio: float
    greedy_identical_tokens: float


@dataclass
class Compression:
    pruning: dict[str, PruneCurve]
    quantization: Quantization
    quantization_dataset: str
    quantization_environment: dict[str, str | int]
    sources: dict[str, str]
    commands: list[str]
    environment: Environment


def run_tool(script: str, flags: list[str], timeout_s: float) -> str:
    command = [sys.executable, str(ROOT / script), *flags]
    print(" ".join(command), flush=True)
    done = run_command(command, timeout_s=timeout_s, stderr=STDOUT)
    if not done.ok:
        what = "timed out" if done.returncode is None else f"failed (exit code {done.returncode})"
        raise ExperimentError(f"{script} {what}:\n{done.stdout[-2000:]}")
    return " ".join(command)


def produce_reports(settings: Settings, work_dir: Path) -> tuple[Path, Path, list[str]]:
    checkpoint = settings.checkpoint or default_checkpoint()[0]
    commands = []
    block = ["--block-size", str(settings.block_size)] if settings.block_size else []
    prune_report = Path(settings.prune_report) if settings.prune_report else None
    quant_report = Path(settings.quant_report) if settings.quant_report else None
    if prune_report is None:
        prune_dir = work_dir / "prune"
        if (prune_dir / PRUNE_REPORT).exists():
            (prune_dir / PRUNE_REPORT).unlink()  # the report accumulates methods: start from none
        for method in settings.methods:
            flags = ["--checkpoint", str(checkpoint), "--method", method, "--target", str(settings.target),
                     "--rounds", str(settings.rounds), "--finetune-steps", str(settings.finetune_steps),
                     "--batch-size", str(settings.batch_size), "--eval-batches", str(settings.eval_batches),
                     "--speed-repeats", str(settings.speed_repeats), "--speed-seq-len", str(settings.speed_seq_len),
                     "--generation-tokens", str(settings.new_tokens), "--dataset", settings.dataset,
                     "--out-dir", str(prune_dir), *block]
            commands.append(run_tool("prune/iterative.py", flags, settings.timeout_s))
        prune_report = prune_dir / PRUNE_REPORT
    if quant_report is None:
        quant_dir = work_dir / "int8"
        flags = ["--checkpoint", str(checkpoint), "--out-dir", str(quant_dir), "--dataset", settings.dataset,
                 "--eval-batches", str(settings.eval_batches), "--repeats", str(settings.speed_repeats),
                 "--new-tokens", str(settings.new_tokens)]
        if settings.block_size:
            flags += ["--eval-block-size", str(settings.block_size)]
        commands.append(run_tool("quantize/dynamic.py", flags, settings.timeout_s))
        quant_report = quant_dir / QUANT_REPORT
    return prune_report, quant_report, commands


def read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise ExperimentError(f"{path} does not exist; run {what} first or leave the flag out to run it here")
    return json.loads(path.read_text())


def pruning_curves(prune: dict) -> dict[str, PruneCurve]:
    return {method: PruneCurve(
        entry["finetune_steps"], entry["dataset"], EvalSettings(**entry["eval"]),
        DenseControl(**entry["dense_control"]) if entry.get("dense_control") else None,
        [PruneRound(r["sparsity_pruned_tensors"], r["val_loss"], r["val_loss_after_pruning"], r["parameters"],
                    r["nonzero_parameters"], r["forward_speedup"], r["generation_speedup"]) for r in entry["rounds"]])
        for method, entry in prune["methods"].items()}


def quantization_table(quant: dict) -> Quantization:
    validation, generation, size = quant["validation"], quant["generation"], quant["size_bytes"]
    batches = sorted((k for k in generation if k.startswith("batch_")), key=lambda k: int(k.split("_")[1]))
    return Quantization(
        FloatInt8(validation["float"]["val_loss"], validation["int8"]["val_loss"],
                  change_pct=validation["loss_increase_pct"]),
        validation["next_token_agreement"],
        {k.replace("_", " "): FloatInt8(generation[k]["float_tokens_per_s"], generation[k]["int8_tokens_per_s"],
                                        speedup=generation[k]["speedup"]) for k in batches},
        {k: generation[k] for k in ("prompt_tokens", "new_tokens", "repeats") if k in generation},
        FloatInt8(size["float"], size["int8"]), size["int8"] / size["float"], quant["greedy"]["identical_tokens"])


def measure(settings: Settings, work_dir: Path) -> Compression:
    prune_path, quant_path, commands = produce_reports(settings, work_dir)
    prune, quant = read_json(prune_path, "prune/iterative.py"), read_json(quant_path, "quantize/dynamic.py")
    return Compression(pruning_curves(prune), quantization_table(quant), quant["dataset"], quant["environment"],
                       {"prune_report": str(prune_path), "quant_report": str(quant_path)}, commands,
                       environment(choose_device("auto")))


def plot(result: Compression):
    fig, (curves, bars) = plt.subplots(1, 2, figsize=(11, 4))
    for method, entry in result.pruning.items():
        curves.plot([r.sparsity for r in entry.rounds], [r.val_loss for r in entry.rounds], marker="o", label=method)
    curves.set_xlabel("sparsity of the pruned tensors")
    curves.set_ylabel("validation loss (after fine-tuning)")
    curves.set_title("pruning")
    quant = result.quantization
    speeds = quant.tokens_per_s.values()
    grouped_bars(bars, list(quant.tokens_per_s), {"float": [t.float for t in speeds], "int8": [t.int8 for t in speeds]})
    bars.set_ylabel("generated tokens / s")
    bars.set_title(f"int8: loss {quant.val_loss.change_pct:+.2f}%, size x{quant.size_ratio:.2f}")
    return finish(fig, (curves, bars), legend=True)


def section(res: Compression, page: Page) -> None:
    page.add("From `prune/` and `quantize/`.\n")
    for method, entry in res.pruning.items():
        page.add(f"Pruning, `{method}`: {entry.finetune_steps} fine-tuning steps after each round, validation on "
                 f"{entry.eval.batches} batches of {entry.eval.batch_size} x {entry.eval.block_size} "
                 f"({entry.dataset}).\n")
        page.table(["sparsity", "val loss", "before fine-tune", "parameters stored", "non-zero", "forward speed",
                    "generation speed"],
                   [[f"{x.sparsity:.0%}", num(x.val_loss, 4), num(x.val_loss_after_pruning, 4), f"{x.parameters:,}",
                     f"{x.nonzero_parameters:,}", f"{x.forward_speedup:.2f}x", f"{x.generation_speedup:.2f}x"]
                    for x in entry.rounds])
        if entry.dense_control:
            page.add(f"Dense control (same fine-tuning, no pruning): val loss {entry.dense_control.val_loss:.4f}.\n")
    q = res.quantization
    rows = [["val loss", num(q.val_loss.float, 4), num(q.val_loss.int8, 4), f"{q.val_loss.change_pct:+.2f}%"]]
    rows += [[f"generated tokens/s, {batch}", num(t.float), num(t.int8), f"{t.speedup:.2f}x"]
             for batch, t in q.tokens_per_s.items()]
    rows.append(["weights on disk (MB)", num(q.size_bytes.float / 1e6), num(q.size_bytes.int8 / 1e6),
                 f"{q.size_ratio:.2f}x"])
    page.add(f"Dynamic int8 quantization ({res.quantization_dataset} validation):\n")
    page.table(["", "float", "int8", "change"], rows)
    page.add(f"Teacher-forced next-token agreement {q.next_token_agreement:.1%}; greedy continuations "
             f"{q.greedy_identical_tokens:.1%} identical tokens.\n")


EXPERIMENT = Experiment(
    name="compression", title="Compression", about=__doc__, settings=Settings,
    quick=Settings(methods=["magnitude", "row"], rounds=2, finetune_steps=10, eval_batches=4, block_size=128,
                   speed_repeats=2),
    full=Settings(methods=["magnitude", "row", "wanda"], rounds=4, finetune_steps=50, eval_batches=16),
    result=Compression, measure=measure, plot=plot, section=section)
