"""The scorecard's --out file while it is measured: each figure is written as soon as it is measured, with its status,
so a run that fails or is stopped keeps what it measured, and `--resume` (with `--only` or not) measures the rest.

A figure's status is `measured`, `failed` (with the cause in one line) or `not measured` (with why: not asked for,
or not reached).  Its raw measurement is kept under `measurements`, and with it the host's state when it was taken,
so a resumed scorecard says which figures came from which run.  A resumed file must have been measured with the
same settings, on the same artifact: figures measured otherwise would not belong together.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.typed_json import ResultShapeError, from_json
from runtime.errors import UserError
from runtime.timing import Spread
from storage.folder import write_durably

FIGURES = ("loss", "inference_latency_1", "inference_latency_12", "training_throughput_4", "training_throughput_12")
MEASURED, FAILED, NOT_MEASURED = "measured", "failed", "not measured"


# Each figure's raw measurement, as the file holds it: the shapes a kept figure is checked against on --resume.
@dataclass
class LossFigure:
    val_loss: float
    val_ppl: float
    val_tokens: int
    measured_on: dict[str, Any]


@dataclass
class GenerationFigure:
    tokens_per_s: Spread
    time_to_first_token_s: Spread
    ms_per_token: Spread
    peak_memory_bytes: int | None
    measured_on: dict[str, Any]


@dataclass
class TrainingFigure:
    tokens_per_s: Spread
    peak_memory_bytes: int | None
    peak_memory_bytes_per_rank: Any
    topology: dict[str, Any]
    command: str
    measured_on: dict[str, Any]


SHAPES = {"loss": LossFigure, "inference_latency_1": GenerationFigure, "inference_latency_12": GenerationFigure,
          "training_throughput_4": TrainingFigure, "training_throughput_12": TrainingFigure}


class ScoreFileError(UserError):
    pass


def parse_figures(text: str) -> tuple[str, ...]:
    """`--only`'s comma-separated keys, each one of FIGURES."""
    keys = tuple(key.strip() for key in text.split(",") if key.strip())
    unknown = [key for key in keys if key not in FIGURES]
    if unknown or not keys:
        raise ScoreFileError(f"--only {text!r}: {'unknown key ' + repr(unknown[0]) if unknown else 'no key'}; give "
                             f"one or more of {', '.join(FIGURES)}, separated by commas")
    return tuple(key for key in FIGURES if key in keys)


def kept_measurements(out: Path | None, settings: dict) -> dict[str, dict]:
    """For `--resume`: the measured figures of the scorecard at `out`, which must have been taken with `settings`."""
    if out is None:
        raise ScoreFileError("--resume finishes the scorecard at --out; give --out")
    try:
        earlier = json.loads(out.read_text())
    except FileNotFoundError:
        raise ScoreFileError(f"--resume: there is no scorecard at {out} to finish; run without --resume") from None
    except (OSError, ValueError, RecursionError) as e:
        raise ScoreFileError(f"--resume: {out} is not a scorecard ({type(e).__name__}: {str(e)[:80]!r}); choose "
                             f"another --out or run without --resume") from None
    if not isinstance(earlier, dict) or not all(isinstance(earlier.get(key), dict)
                                                for key in ("status", "measurements", "settings")):
        raise ScoreFileError(f"--resume: {out} holds no figure statuses (written by an older scorecard, or not one); "
                             f"measure it again without --resume")
    changed = sorted(key for key in set(settings) | set(earlier["settings"])
                     if settings.get(key) != earlier["settings"].get(key))
    if changed:
        key = changed[0]
        raise ScoreFileError(f"--resume: {out} was measured with {key!r} = {earlier['settings'].get(key)!r:.60}, "
                             f"not {settings.get(key)!r:.60}; resume with its settings, or measure into another --out")
    kept = {}
    for figure in FIGURES:
        status = earlier["status"].get(figure)
        if not (isinstance(status, dict) and status.get("status") == MEASURED):
            continue
        try:
            kept[figure] = asdict(from_json(SHAPES[figure], earlier["measurements"].get(figure),
                                            f"measurements.{figure}"))
        except ResultShapeError as e:
            raise ScoreFileError(f"--resume: {out} says {figure} was measured, but {e}; measure it again without "
                                 f"--resume") from None
    return kept


class Progress:
    """The figures of one scorecard run: which to measure, what each became, and the raw measurements."""

    def __init__(self, wanted: tuple[str, ...], kept: dict[str, dict]):
        self.measurements = dict(kept)
        self.status = {figure: {"status": MEASURED, "when": "kept from the file --resume finished"} if figure in kept
                       else {"status": NOT_MEASURED, "why": "not reached yet" if figure in wanted
                             else "not asked for (--only)"} for figure in FIGURES}
        self.todo = tuple(figure for figure in wanted if figure not in kept)

    def wants(self, figure: str) -> bool:
        return figure in self.todo

    def measured(self, figure: str, measurement: dict) -> None:
        self.measurements[figure] = measurement
        self.status[figure] = {"status": MEASURED, "when": "this run"}

    def failed(self, figure: str, cause: str) -> None:
        self.status[figure] = {"status": FAILED, "cause": cause}

    def stopped(self, cause: str) -> None:
        """Every figure not yet reached says why: the run ended before it."""
        for status in self.status.values():
            if status.get("why") == "not reached yet":
                status["why"] = f"not reached: {cause}"

    @property
    def complete(self) -> bool:
        return all(status["status"] == MEASURED for status in self.status.values())


def write(out: Path, text: str) -> None:
    """Written beside and renamed into place: a stop never leaves half a scorecard at `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_durably(out, text + "\n")
