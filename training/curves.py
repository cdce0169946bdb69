"""Training curves as pictures: one run's `curves.png` (kept up to date at every evaluation) and
several runs overlaid (`python -m bench.eval.plot_runs RUN [RUN ...]`), read from their metrics.jsonl."""
from __future__ import annotations

import os
from pathlib import Path

from runtime.parsed import Unparsable, json_value

CURVES_FILE = "curves.png"
METRICS_FILE = "metrics.jsonl"


def read_metrics(run: Path) -> tuple[list[dict], list[dict]]:
    """(step records, evaluation records) of a run folder; a resumed run's re-logged steps keep the last."""
    path = Path(run) / METRICS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: {run} is not a train.py run folder")
    steps, evals = {}, {}
    for line in path.read_text().splitlines():
        try:
            record = json_value(line)
        except Unparsable:
            continue  # a line cut short by a crash
        if "loss" in record:
            steps[record["step"]] = record
        elif "val_loss" in record:
            evals[record["step"]] = record
    return [steps[k] for k in sorted(steps)], [evals[k] for k in sorted(evals)]


def run_labels(runs: list[Path]) -> list[str]:
    """Each run named by the fewest trailing parts of its path that tell it from the others: out/demo/train,
    out/demo/fsdp and out/train become demo/train, fsdp and train."""
    parts = [Path(run).resolve().parts for run in runs]
    labels = []
    for mine in parts:
        for depth in range(1, len(mine) + 1):
            tail = mine[-depth:]
            if all(other == mine or other[-depth:] != tail for other in parts):
                break
        labels.append("/".join(tail))
    return labels


def plot_runs(runs: list[Path], out: Path, labels: list[str] | None = None) -> Path:
    """Train and validation loss against tokens seen, learning rate and tokens/s: one panel each, one
    colour per run.  Written atomically (a reader never sees half a PNG)."""
    # Imported here, not at the top: a run with --no-curves never pays for importing matplotlib.
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    labels = labels or run_labels(runs)
    metrics = [read_metrics(run) for run in runs]
    # Runs logged before records carried `tokens` are drawn against the step.
    by_tokens = all("tokens" in r for steps, evals in metrics for r in steps + evals)
    most = max((r["tokens"] for steps, _ in metrics for r in steps), default=0) if by_tokens else 0
    scale, unit = (1e6, "millions") if most >= 1e6 else (1e3, "thousands")
    x = (lambda r: r["tokens"] / scale) if by_tokens else (lambda r: r["step"])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    loss_ax, lr_ax, speed_ax = axes
    for (steps, evals), label, colour in zip(metrics, labels, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4):
        loss_ax.plot([x(r) for r in steps], [r["loss"] for r in steps], color=colour, alpha=0.5, lw=1,
                     label=f"{label} train")
        loss_ax.plot([x(r) for r in evals], [r["val_loss"] for r in evals], "o-", color=colour, lw=2,
                     label=f"{label} validation")
        lr_ax.plot([x(r) for r in steps], [r["lr"] for r in steps], color=colour, label=label)
        speed_ax.plot([x(r) for r in steps], [r["tokens_per_s"] for r in steps], color=colour, label=label)
    for ax, title, ylabel in ((loss_ax, "loss", "cross-entropy (nats/token)"), (lr_ax, "learning rate", "lr"),
                              (speed_ax, "throughput", "tokens/s (whole job)")):
        ax.set_title(title)
        ax.set_xlabel(f"tokens seen ({unit})" if by_tokens else "step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    partial = out.with_name(f".{out.name}.partial.png")
    fig.savefig(partial, dpi=110)
    plt.close(fig)
    os.replace(partial, out)
    return out
