"""Training curves as pictures: one run's `curves.png` (kept up to date at every evaluation) and
several runs overlaid (`python -m bench.eval.plot_runs RUN [RUN ...]`), read from their metrics.jsonl."""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from runtime.parsed import Unparsable, json_value

log = logging.getLogger(__name__)

CURVES_FILE = "curves.png"
METRICS_FILE = "metrics.jsonl"
# The numbers the panels draw from each kind of record (`tokens` too where a record has it: records logged before
# it was written have none).
STEP_FIELDS = ("step", "loss", "lr", "tokens_per_s")
EVAL_FIELDS = ("step", "val_loss")
# Each file's bad lines as last said, by count: train.py draws its curves again at every evaluation, and a warning
# repeated at each one buried the log's other lines.  More bad lines are said again.
_SAID: dict[Path, int] = {}


def metrics_path(run: Path) -> Path:
    """The metrics.jsonl of run folder `run`; FileNotFoundError naming the folder where it has none."""
    path = Path(run) / METRICS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: {run} is not a train.py run folder")
    return path


def read_metrics(run: Path) -> tuple[list[dict], list[dict]]:
    """(step records, evaluation records) of a run folder; a resumed run's re-logged steps keep the last.  A last
    line cut short by a crash is left out; any other line that is not a record the curves can draw (not JSON, not
    an object, a field that is not a number) is left out too, and said in one warning for the file (once a process,
    again when more such lines appear)."""
    path = metrics_path(run)
    steps, evals = {}, {}
    lines = path.read_text(errors="replace").splitlines()
    bad: list[tuple[int, str]] = []
    for number, line in enumerate(lines, 1):
        try:
            record = json_value(line)
        except Unparsable as e:
            if number < len(lines):  # the last line is the one a crash cuts short: expected, and not said
                bad.append((number, f"not JSON: {e}"))
            continue
        if not isinstance(record, dict):
            bad.append((number, f"{json_kind(record)}, not an object"))
        elif "loss" in record or "val_loss" in record:
            fields = (*(STEP_FIELDS if "loss" in record else EVAL_FIELDS), *(("tokens",) if "tokens" in record else ()))
            if wrong := [f for f in fields if not number_in(record, f)]:
                bad.append((number, f"{', '.join(wrong)} not a number"))
            else:
                (steps if "loss" in record else evals)[record["step"]] = record
        # an object with neither is a record of another kind: not drawn, and not an error
    if bad and _SAID.get(resolved := path.resolve()) != len(bad):
        _SAID[resolved] = len(bad)
        line, why = bad[0]
        log.warning("%s: left out %d line%s that %s not a training record (line %d: %s); the curves show the rest",
                    path, len(bad), "s" * (len(bad) > 1), "are" if len(bad) > 1 else "is", line, why[:200])
    return [steps[k] for k in sorted(steps)], [evals[k] for k in sorted(evals)]


def json_kind(value: object) -> str:
    """What a parsed JSON value is, in JSON's words."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return {list: "an array", str: "a string"}.get(type(value), "a number")


def number_in(record: dict, field: str) -> bool:
    """Whether `record[field]` is a number a panel can draw: an integer or a float (not a bool) within a float's
    range; a NaN or infinite loss is drawn as the gap it is, but the step and token count place every point, so
    they must be finite."""
    value = record.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        as_float = float(value)
    except OverflowError:  # an integer past a float's range (1e308)
        return False
    return field not in ("step", "tokens") or math.isfinite(as_float)


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
