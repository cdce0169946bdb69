"""The hostile-input suite's long run (`make fuzz`): tests/test_hostile_*.py under Hypothesis's `fuzz` profile, round
after round with fresh random examples until the time is up, every attempt counted per surface and outcome.

    python -m tests.fuzz                     # 20 minutes; writes bench/results/fuzz.json
    python -m tests.fuzz --minutes 3         # a shorter look

`make test` runs the same properties under the fixed-seed `ci` profile; here each property draws FUZZ_FACTOR
times the examples (tests/hostile.py), and each round new ones.  A round stops at its first failing property and
the run goes on with the next round: the report counts failures, and names them, rather than stopping at one.
"""
from __future__ import annotations

import collections
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.processes import ROOT, run_command
from bench.record import RESULTS_DIR, write_result
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.errors import UserError
from runtime.timing import Environment, environment
from tests.hostile import FUZZ_FACTOR, PROFILE_ENV, REPORT_ENV

SUITE = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_hostile_*.py"))
BAD_OUTCOMES = ("traceback", "bad message", "source changed")
KEPT_BAD_EXAMPLES = 5


@dataclass
class FuzzConfig:
    minutes: float = option(20.0, "how long to keep starting rounds (a round under way is finished)", above=0)
    workers: int = option(2, "pytest-xdist workers (one per core)", min=1)
    results_dir: Path = option(RESULTS_DIR, "where fuzz.json goes")

    def __post_init__(self):
        check_options(self, UserError)


@dataclass
class SurfaceCount:
    surface: str
    attempts: int
    outcomes: dict[str, int]  # worked, refused, exit 130, ... and the bad ones: traceback, bad message, source changed
    bad_examples: list[str] = field(default_factory=list)  # what the first bad outcomes said, to start a diagnosis


@dataclass
class FuzzReport:
    commit: str
    minutes: float
    rounds: int
    fuzz_factor: int
    attempts: int
    tracebacks: int
    bad_messages: int
    sources_changed: int
    failed_properties: list[str]  # pytest's FAILED lines, over all rounds
    surfaces: list[SurfaceCount] = field(default_factory=list)
    environment: Environment | None = None


def run_round(report_path: Path, workers: int) -> list[str]:
    """One pytest run of the suite under the fuzz profile; returns its FAILED lines."""
    run = run_command([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers), "--dist",
                       "loadfile", "-x", *SUITE], env={PROFILE_ENV: "fuzz", REPORT_ENV: str(report_path)})
    failed = [line for line in run.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    for line in run.stdout.splitlines():  # what a user needs to replay a failure: the property and its example
        if line.startswith(("FAILED", "ERROR")) or "@reproduce_failure" in line or \
                line.startswith("E   ") and ("Error" in line or "Falsifying" in line):
            print(line, flush=True)
    if run.returncode not in (0, 1) and not failed:  # pytest itself broke (usage error, collection error)
        raise UserError(f"pytest exited {run.returncode}: {run.stdout.strip().splitlines()[-1:]}")
    return failed


def count(report_path: Path) -> list[SurfaceCount]:
    by_surface: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    bad: dict[str, list[str]] = collections.defaultdict(list)
    if report_path.exists():
        for line in report_path.read_text().splitlines():
            row = json.loads(line)
            by_surface[row["surface"]][row["outcome"]] += 1
            if row["outcome"] in BAD_OUTCOMES and len(bad[row["surface"]]) < KEPT_BAD_EXAMPLES:
                bad[row["surface"]].append(f"{row['outcome']}: {row['detail']}")
    return [SurfaceCount(s, sum(c.values()), dict(sorted(c.items())), bad[s]) for s, c in sorted(by_surface.items())]


def fuzz(cfg: FuzzConfig) -> FuzzReport:
    if not SUITE:
        raise UserError("no tests/test_hostile_*.py files: run this from the repository")
    commit = run_command(["git", "rev-parse", "--short", "HEAD"]).stdout.strip()
    deadline, rounds, failed = time.monotonic() + cfg.minutes * 60, 0, []
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "attempts.jsonl"
        while time.monotonic() < deadline:
            rounds += 1
            failed += run_round(report_path, cfg.workers)
            report = fuzz_report(commit, cfg.minutes, rounds, failed, count(report_path))
            write_result(cfg.results_dir, "fuzz", report)  # a run stopped early keeps its finished rounds
            print(f"round {rounds}: {report.attempts:,} attempts so far, {len(report.failed_properties)} failing "
                  f"properties", flush=True)
    return report


def fuzz_report(commit: str, minutes: float, rounds: int, failed: list[str],
                surfaces: list[SurfaceCount]) -> FuzzReport:
    totals = collections.Counter()
    for s in surfaces:
        totals.update(s.outcomes)
    return FuzzReport(commit, minutes, rounds, FUZZ_FACTOR, sum(s.attempts for s in surfaces), totals["traceback"],
                      totals["bad message"], totals["source changed"], list(dict.fromkeys(failed)), surfaces,
                      environment(torch.device("cpu")))


def table(report: FuzzReport) -> str:
    """The reliability table (bench/by_hand.md, copied into bench/REPORT.md)."""
    outcomes = sorted({o for s in report.surfaces for o in s.outcomes} - set(BAD_OUTCOMES))
    rows = ["| surface | inputs tried | " + " | ".join(outcomes) + " | " + " | ".join(BAD_OUTCOMES) + " |",
            "|---|---:|" + "---:|" * (len(outcomes) + len(BAD_OUTCOMES))]
    for s in report.surfaces:
        rows.append(f"| {s.surface} | {s.attempts:,} | " + " | ".join(f"{s.outcomes.get(o, 0):,}" for o in outcomes)
                    + " | " + " | ".join(str(s.outcomes.get(o, 0)) for o in BAD_OUTCOMES) + " |")
    return "\n".join(rows)


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(FuzzConfig, __doc__, argv)
    report = fuzz(cfg)
    print(table(report))
    print(f"{report.rounds} rounds, {report.attempts:,} inputs: {report.tracebacks} tracebacks, "
          f"{report.bad_messages} unclear messages, {report.sources_changed} changed sources, "
          f"{len(report.failed_properties)} failing properties")
    if report.failed_properties:
        sys.exit("error: some properties failed:\n" + "\n".join(report.failed_properties))


if __name__ == "__main__":
    main()
