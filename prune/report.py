"""`prune_report.json`: its rows, the file and its plots.

One report per output folder, keyed by method, so running several methods into the
same folder accumulates one curve per method; the checkpoint in the folder is always
the latest run's, and the report's top-level `checkpoint` entry says which that is.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import matplotlib
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from model.gpt import GPT
from prune.masks import count_nonzero
from prune.speed import read_ratio
from runtime.errors import UserError
from runtime.parsed import Unparsable, json_value

REPORT_FILE = "prune_report.json"
LOSS_PLOT = "loss_vs_sparsity.png"
SPEED_PLOT = "speed_vs_sparsity.png"


class ReportError(UserError, ValueError):
    pass


def read_report(folder: Path) -> dict:
    path = folder / REPORT_FILE
    if not path.exists():
        return {"methods": {}}
    try:
        report = json_value(path.read_bytes())
    except Unparsable as e:
        raise ReportError(f"{path} is not valid JSON ({e}); delete it or choose another --out-dir") from e
    if not isinstance(report.get("methods"), dict):
        raise ReportError(f"{path} is not a prune report (no 'methods' table); choose another --out-dir")
    return report


def round_row(round_number: int, target_sparsity: float, val_loss_after_pruning: float | None, val_loss: float,
              finetune_steps: int, counts: dict) -> dict:
    """One entry of a method's `rounds` (round 0 is the dense model): losses and sparsity, to which the
    caller adds the method's details, the measured speed and the timings."""
    return {"round": round_number, "target_sparsity": target_sparsity, "val_loss_after_pruning": val_loss_after_pruning,
            "val_loss": val_loss, "finetune_steps": finetune_steps, **counts}


def sparsity_counts(model: GPT, pruned_tensors: list[torch.Tensor], pruned_total: int, all_total: int) -> dict:
    """Exact counts: zero or removed entries over the original size of the pruned tensors, and of every parameter."""
    pruned_nonzero, _ = count_nonzero(pruned_tensors)
    all_nonzero, stored = count_nonzero(list(model.parameters()))
    return {"sparsity_pruned_tensors": 1 - pruned_nonzero / pruned_total, "sparsity_all_params": 1 - all_nonzero / all_total,
            "pruned_tensors_nonzero": pruned_nonzero, "pruned_tensors_original": pruned_total,
            "parameters": stored, "nonzero_parameters": all_nonzero, "parameters_original": all_total}


def round_summary(row: dict, rounds: int, stored_dense: bool) -> str:
    """One round in a line.  Each speed ratio sits beside the round's own noise floor, or reads as not measurable
    (prune/speed.py's `read_ratio`); `stored_dense`: the pruned weights are zeros in dense tensors (magnitude,
    wanda)."""
    speed = (f"speed against dense: forward {read_ratio(row, 'forward')}, generation "
             f"{read_ratio(row, 'generation')}")
    if stored_dense:
        speed += " (the zeros are stored dense: the model does the same work)"
    if "csr" in row:
        speed += f"; CSR forward {read_ratio(row, 'forward', row['csr']['forward_speedup'])}"
    return (f"round {row['round']}/{rounds}: sparsity {row['sparsity_pruned_tensors']:.2%} of the pruned tensors "
            f"({row['sparsity_all_params']:.2%} of all parameters), val_loss {row['val_loss_after_pruning']:.4f} "
            f"after pruning -> {row['val_loss']:.4f} after {row['finetune_steps']} fine-tune steps; {speed}")


def _sparsity(row: dict) -> float:
    return row["sparsity_pruned_tensors"]


def plot_loss(report: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, entry in sorted(report["methods"].items()):
        rows = entry["rounds"]
        ax.plot([_sparsity(r) for r in rows], [r["val_loss"] for r in rows], marker="o", label=f"{method}")
        if entry["finetune_steps"]:
            ax.plot([_sparsity(r) for r in rows[1:]], [r["val_loss_after_pruning"] for r in rows[1:]],
                    linestyle=":", marker=".", color=ax.lines[-1].get_color(), label=f"{method}, before fine-tune")
        control = entry.get("dense_control")
        if control:
            ax.plot([0.0], [control["val_loss"]], marker="*", markersize=10, linestyle="none",
                    color=ax.lines[-1].get_color(), label=f"{method}: dense + {control['finetune_steps']} steps")
    ax.set_xlabel("sparsity of the pruned tensors (zero or removed / original)")
    ax.set_ylabel("validation loss")
    ax.set_title("Validation loss against sparsity")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
    plt.close(fig)


def plot_speed(report: dict, path: Path) -> None:
    """Measured speed relative to the dense model timed in the same run (1.0 = no faster)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, entry in sorted(report["methods"].items()):
        rows = entry["rounds"]
        xs = [_sparsity(r) for r in rows]
        ax.plot(xs, [r["forward_speedup"] for r in rows], marker="o", label=f"{method}: forward")
        ax.plot(xs, [r["generation_speedup"] for r in rows], marker="s", linestyle="--",
                color=ax.lines[-1].get_color(), label=f"{method}: generation")
        csr = [(x, r["csr"]["forward_speedup"]) for x, r in zip(xs, rows) if r.get("csr")]
        if csr:
            ax.plot(*zip(*csr), marker="^", linestyle=":", color=ax.lines[-1].get_color(),
                    label=f"{method}: forward, sparse CSR weights")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("sparsity of the pruned tensors (zero or removed / original)")
    ax.set_ylabel("measured speed / dense (same run)")
    ax.set_title("Throughput against sparsity")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
    plt.close(fig)


def report_writers(report: dict) -> dict[str, Callable[[Path], None]]:
    """Writers for `write_folder_atomically`: the report and both plots, saved with the checkpoint."""
    return {
        REPORT_FILE: lambda p: p.write_text(json.dumps(report, indent=2) + "\n"),
        LOSS_PLOT: lambda p: plot_loss(report, p),
        SPEED_PLOT: lambda p: plot_speed(report, p),
    }
