"""`prune_report.json` and its plots.

One report per output folder, keyed by method, so running several methods into the
same folder accumulates one curve per method; the checkpoint in the folder is always
the latest run's, and the report's top-level `checkpoint` entry says which that is.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from runtime.errors import UserError

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
        report = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ReportError(f"{path} is not valid JSON ({e}); delete it or choose another --out-dir") from e
    if not isinstance(report.get("methods"), dict):
        raise ReportError(f"{path} is not a prune report (no 'methods' table); choose another --out-dir")
    return report


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
