"""Overlay the training curves of several runs in one picture (loss against tokens seen, learning rate,
tokens/s), e.g. ddp against fsdp against tp, or a run before and after pruning's fine-tune.

    python -m bench.eval.plot_runs out/ddp out/fsdp out/tp --out out/compare.png
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.cli import entry_point, option, parse_config
from runtime.errors import UserError
from training.curves import metrics_path, plot_runs


class PlotError(UserError):
    pass


@dataclass
class PlotConfig:
    runs: list[str] = option([], "train.py run folders (holding metrics.jsonl)", positional=True)
    out: str = option("curves.png", "the PNG to write")
    labels: str | None = option(None, "comma-separated legend names (default: the fewest trailing parts of "
                                      "each folder's path that tell the runs apart)")

    def __post_init__(self):
        if not self.runs:
            raise PlotError("name at least one run folder: python -m bench.eval.plot_runs RUN [RUN ...]")
        if self.labels is not None and len(self.labels.split(",")) != len(self.runs):
            raise PlotError(f"--labels names {len(self.labels.split(','))} runs but {len(self.runs)} were given")


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(PlotConfig, __doc__, argv)
    for run in cfg.runs:
        try:
            metrics_path(run)  # each folder checked before any is read
        except FileNotFoundError as e:
            raise PlotError(str(e)) from e
    out = plot_runs(cfg.runs, cfg.out, cfg.labels.split(",") if cfg.labels else None)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
