"""The experiments' figures: what every `plot` shares -- bars of measured spreads, groups of bars side by side, the
figure's ending and its file -- so that each experiment's `plot` draws only what it measured."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from runtime.timing import Spread


def bars(ax, at, values: list, scale: float = 1.0, horizontal: bool = False, **bar):
    """Bars at `values` (`horizontal`: along x): numbers, or Spreads drawn at their medians with their min-max as
    error bars (None: no bar, for a side that did not run)."""
    if any(isinstance(v, Spread) for v in values):
        spreads = values
        values = [v.median * scale if v else 0.0 for v in spreads]
        bar = {"capsize": 3, **bar, "xerr" if horizontal else "yerr": [
            [m - v.min * scale if v else 0 for m, v in zip(values, spreads)],
            [v.max * scale - m if v else 0 for m, v in zip(values, spreads)]]}
    else:
        values = [0.0 if v is None else v for v in values]
    return (ax.barh if horizontal else ax.bar)(at, values, **bar)


def grouped_bars(ax, labels: list[str], groups: dict[str, list], scale: float = 1.0, horizontal: bool = False,
                 **bar) -> dict:
    """One bar per group at each label, side by side, the labels beside them (values as `bars` takes them);
    returns each group's bars, for labels on them."""
    size = 0.8 / len(groups)
    drawn = {}
    for i, (name, values) in enumerate(groups.items()):
        at = [j + (i - (len(groups) - 1) / 2) * size for j in range(len(labels))]
        drawn[name] = bars(ax, at, values, scale, horizontal, label=name, **{"height" if horizontal else "width": size},
                           **bar)
    (ax.set_yticks if horizontal else ax.set_xticks)(range(len(labels)), labels)
    return drawn


def finish(fig, axes, title: str | None = None, *, grid: str = "both", legend: bool = False):
    """What every figure ends with: faint grid lines along `grid` ("x", "y" or "both") and, when asked, a legend
    on each of `axes`; `title` above all the panels.  Returns the figure, as `Experiment.plot` does."""
    for ax in axes:
        ax.grid(alpha=0.3, axis=grid)
        if legend:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def save_figure(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=90)
    plt.close(fig)
