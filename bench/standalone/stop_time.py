"""How long train.py takes to exit after SIGTERM in the middle of a long step, saving the last whole step.

    python bench/standalone/stop_time.py   # about 8 minutes on 2 CPU cores; writes bench/results/stop_time.json

The run is GPT-2 124M at a CPU-sized batch (4 x 256 tokens, 32 micro-batches a step: about two minutes a step on
2 cores), so a stop that waited for the step to end would take a minute on average.  Each repeat starts the run
in a fresh folder, waits for step 1 to finish (so the save holds optimizer state too), lets step 2 run
`--into-step-s` seconds, sends SIGTERM and times the exit; the exit status and the saved step are checked.
"""
from __future__ import annotations

import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.processes import STDOUT, start
from bench.record import RESULTS_DIR, write_result
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.errors import UserError
from runtime.timing import Environment, Spread, environment
from storage.training_state import TrainingState

COMMAND = ["train.py", "--model", "gpt2", "--dataset", "builtin", "--batch-size", "4", "--grad-accum", "32",
           "--block-size", "256", "--max-steps", "100", "--log-interval", "1", "--no-curves"]


@dataclass
class StopTimeConfig:
    repeats: int = option(3, "runs stopped", min=1)
    into_step_s: float = option(10.0, "seconds into step 2 at which SIGTERM is sent", min=0)
    results_dir: Path = option(RESULTS_DIR, "where stop_time.json goes")

    def __post_init__(self):
        check_options(self, UserError)


@dataclass
class StopTime:
    command: str
    into_step_s: float
    exit_after_sigterm_s: Spread
    step_s: Spread  # step 1's time, from its log line's tokens/s
    exit_statuses: list[int]
    saved_steps: list[int]
    estimate_lines: list[str]  # what the first micro-batch made train.py say, per repeat
    stop_lines: list[str]  # what SIGTERM made it say at once, per repeat
    environment: Environment


def stop_once(cfg: StopTimeConfig, out: Path) -> tuple[float, float, int, int, str, str]:
    proc = start([sys.executable, *COMMAND, "--out-dir", str(out)], stderr=STDOUT)
    step_s, estimate, said = None, "", ""
    for line in proc.stdout:
        print(line, end="", flush=True)
        estimate = line.strip() if line.startswith("first micro-batch") else estimate
        if line.startswith("step 1/"):
            tokens_per_s = float(line.split(" tokens/s")[0].rsplit(", ", 1)[1].replace(",", ""))
            step_s = 4 * 32 * 256 / tokens_per_s
            break
    if step_s is None:
        raise UserError(f"the run ended before step 1 (exit {proc.wait()})")
    time.sleep(cfg.into_step_s)
    sent = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    for line in proc.stdout:
        print(line, end="", flush=True)
        said = line.strip() if line.startswith("SIGTERM:") else said
    status = proc.wait()
    exit_s = time.perf_counter() - sent
    saved = TrainingState.read(out).step
    return exit_s, step_s, status, saved, estimate, said


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(StopTimeConfig, __doc__, argv)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(cfg.repeats):
            runs.append(stop_once(cfg, Path(tmp) / f"run-{i}"))
            print(f"repeat {i + 1}: exit {runs[-1][0]:.1f} s after SIGTERM (step {runs[-1][1]:.0f} s), "
                  f"status {runs[-1][2]}, saved step {runs[-1][3]}", flush=True)
    result = StopTime(" ".join(["python", *COMMAND]), cfg.into_step_s, Spread.of([r[0] for r in runs]),
                      Spread.of([r[1] for r in runs]), [r[2] for r in runs], [r[3] for r in runs],
                      [r[4] for r in runs], [r[5] for r in runs], environment(torch.device("cpu")))
    write_result(cfg.results_dir, 'stop_time', result)


if __name__ == "__main__":
    main()
