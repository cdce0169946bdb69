"""Measured speed of pruned GPT-2 against dense, on random weights (speed does not depend on training).

    python -m bench.experiments prune_speed --threads 1   # gpt2 preset, row pruning to 50% widths, CSR at 50-95%
    python -m bench.experiments prune_speed --preset tiny --repeats 3

Row pruning: forward tokens/s with logits at every position (as training and evaluation run it)
and with logits at the last position only (a generation prefill), and KV-cache generation tokens/s.
Unstructured: the same model magnitude-pruned to each sparsity with its block weights stored as
sparse CSR, against dense.  Every pruned model is timed interleaved with the dense one in this run
(prune/speed.py); figures are medians of the repeats.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiment import Experiment, ExperimentSettings
from bench.plots import finish, plt
from bench.report_page import Page, decode_path, num, timed_as
from model.config import PRESETS, preset
from model.gpt import GPT
from prune.csr import csr_copy
from prune.magnitude import magnitude_masks
from prune.masks import block_linear_weights
from prune.speed import SpeedSettings, forward_tokens_per_s, generation_tokens_per_s
from prune.structured import select_units, shrink
from runtime.cli import option
from runtime.device import choose_device
from runtime.progress import ProgressBar
from runtime.timing import Environment, environment

ROW_FIGURES = ("forward_full_logits", "forward_last_logits", "generation")


@dataclass
class Settings(ExperimentSettings):
    preset: str = option("gpt2", "model preset (random weights)", choices=tuple(PRESETS))
    target: float = option(0.5, "share of each layer's heads and MLP units removed", above=0, below=1)
    batch_size: int = option(1, "rows per timed forward pass", min=1)
    seq_len: int = option(128, "length of the timed forward passes", min=1)
    generation_tokens: int = option(16, "tokens per timed generation", min=1)
    repeats: int = option(7, "timed repeats (interleaved with dense)", min=1)
    csr_sparsities: list[float] = option([0.5, 0.8, 0.9, 0.95], "unstructured sparsities to time in CSR format",
                                         min=0, below=1)
    device: str = option("auto", "auto, cpu, cuda, ...")
    threads: int | None = option(None, "CPU threads for torch (default: torch's choice); "
                                       "1 is steadier on a shared machine", min=1)
    seed: int = option(0, "seed of the random weights")


@dataclass
class Comparison:
    dense_tokens_per_s: float
    pruned_tokens_per_s: float
    speedup: float


@dataclass
class RowPruning:
    target: float
    widths: dict[str, list[int]]  # mlp_hidden and n_head_per_layer, per layer
    forward_full_logits: Comparison
    forward_last_logits: Comparison
    generation: Comparison


@dataclass
class CsrRow:
    sparsity: float
    forward: Comparison
    generation: Comparison


@dataclass
class PruneSpeed:
    preset: str
    settings: dict[str, int | str]  # prune/speed.py's SpeedSettings
    parameters: dict[str, int]  # dense, row_pruned
    row: RowPruning
    csr: list[CsrRow]
    environment: Environment


def compare(speeds: dict[str, float], pruned: str) -> Comparison:
    return Comparison(speeds["dense"], speeds[pruned], speeds[pruned] / speeds["dense"])


def measure(settings: Settings, work_dir: Path) -> PruneSpeed:
    device = choose_device(settings.device)
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    dense = GPT(preset(settings.preset)).to(device).eval()
    vocab = dense.config.vocab_size
    keep_hidden, keep_heads = select_units(dense, settings.target, dense.config)
    row = shrink(dense, keep_hidden, keep_heads).eval()
    speed = SpeedSettings(settings.batch_size, settings.seq_len, settings.generation_tokens, settings.repeats)
    models = {"dense": dense, "row": row}
    with ProgressBar(total=3, desc="row pruning speed") as bar:
        full = forward_tokens_per_s(models, speed, device, vocab)
        bar.update()
        last = forward_tokens_per_s(models, dataclasses.replace(speed, logits="last"), device, vocab)
        bar.update()
        gen = generation_tokens_per_s(models, speed, device, vocab)
        bar.update()
    row_pruning = RowPruning(settings.target, {"mlp_hidden": row.config.mlp_hidden,
                                               "n_head_per_layer": row.config.n_head_per_layer},
                             compare(full, "row"), compare(last, "row"), compare(gen, "row"))
    csr = []
    for sparsity in ProgressBar(settings.csr_sparsities, desc="CSR speed"):
        masked = GPT(dense.config).to(device).eval()
        masked.load_state_dict(dense.state_dict())
        magnitude_masks(block_linear_weights(masked), sparsity).apply()
        models = {"dense": dense, "csr": csr_copy(masked)}
        csr.append(CsrRow(sparsity, compare(forward_tokens_per_s(models, speed, device, vocab), "csr"),
                          compare(generation_tokens_per_s(models, speed, device, vocab), "csr")))
    result = PruneSpeed(settings.preset, dataclasses.asdict(speed),
                        {"dense": dense.num_parameters(), "row_pruned": row.num_parameters()}, row_pruning, csr,
                        environment(device))
    print(f"{settings.preset} on {device} ({torch.get_num_threads()} threads), batch {settings.batch_size} x "
          f"{settings.seq_len}, median of {settings.repeats}; parameters {result.parameters['dense']:,} -> "
          f"{result.parameters['row_pruned']:,}")
    for name in ROW_FIGURES:
        r = getattr(row_pruning, name)
        print(f"  row {settings.target:.0%}  {name:20s} dense {r.dense_tokens_per_s:10,.1f}  pruned "
              f"{r.pruned_tokens_per_s:10,.1f} tokens/s  speedup {r.speedup:.2f}x")
    for r in csr:
        print(f"  CSR {r.sparsity:.0%}  forward {r.forward.speedup:.2f}x  generation {r.generation.speedup:.2f}x dense")
    return result


def plot(result: PruneSpeed):
    fig, (rows, csr) = plt.subplots(1, 2, figsize=(10, 3.6))
    rows.bar([name.replace("_", "\n") for name in ROW_FIGURES],
             [getattr(result.row, name).speedup for name in ROW_FIGURES])
    rows.set_title(f"row pruning, {result.row.target:.0%} of widths removed")
    xs = [f"{r.sparsity:.0%}" for r in result.csr]
    csr.plot(xs, [r.forward.speedup for r in result.csr], marker="o", label="forward")
    csr.plot(xs, [r.generation.speedup for r in result.csr], marker="o", label="generation")
    csr.set_xlabel("unstructured sparsity (CSR)")
    csr.set_title("magnitude pruning stored as CSR")
    csr.legend()
    for ax in (rows, csr):
        ax.axhline(1, color="grey", linestyle=":")
        ax.set_ylabel("speed-up over dense")
    return finish(fig, (rows, csr), f"{result.preset}, random weights, threads {result.environment.threads}", grid="y")


def section(res: PruneSpeed, page: Page) -> None:
    s = res.settings
    page.add(f"`{res.preset}` with random weights ({res.parameters['dense']:,} parameters; "
             f"{res.parameters['row_pruned']:,} after row pruning), batch {s['batch_size']} x {s['seq_len']}, "
             f"{s['generation_tokens']} generated tokens, medians of {s['repeats']} repeats interleaved with dense, "
             f"{res.environment.threads} thread(s).\n")
    page.add(timed_as(f"the models' forward passes, and `generate()` on models not packed as sample.py packs them, "
                      f"{decode_path('auto')}, all in this one process",
                      "not overlapped: one untimed call per model and figure in this process, one after another"))
    page.table(["row pruning", "dense tokens/s", "pruned tokens/s", "speedup"],
               [[name.replace("_", " "), num(c.dense_tokens_per_s), num(c.pruned_tokens_per_s), f"{c.speedup:.2f}x"]
                for name, c in ((n, getattr(res.row, n)) for n in ROW_FIGURES)])
    page.table(["CSR sparsity", "forward speedup", "generation speedup"],
               [[f"{r.sparsity:.0%}", f"{r.forward.speedup:.2f}x", f"{r.generation.speedup:.2f}x"] for r in res.csr])


EXPERIMENT = Experiment(
    name="prune_speed", title="Pruned against dense speed", about=__doc__, settings=Settings,
    quick=Settings(preset="small-cpu", repeats=3, csr_sparsities=[0.5, 0.9], threads=1),
    full=Settings(threads=1),
    result=PruneSpeed, measure=measure, plot=plot, section=section)
