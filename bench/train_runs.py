"""Run `train.py` as the user would (one process, or under torchrun) and read back its metrics.jsonl.

The experiments measure the project's own training path rather than a copy of it: a run here is
`python train.py ...` or `python -m torch.distributed.run --standalone --nproc_per_node=N train.py
--parallel MODE ...`, with a fixed thread count per rank, and the figures come from the records
train.py logs (tokens/s per log window, phase times, communication, peak memory per rank).
"""
from __future__ import annotations

import dataclasses
import json
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench.processes import ROOT, STDOUT, run_command
from runtime.cli import non_default_flags
from runtime.timing import Spread
from storage.run_folder import is_training_checkpoint
from training.config import TrainConfig

TRAIN_SCRIPT = ROOT / "train.py"
# train.py's message when a batch does not fit (it catches torch.OutOfMemoryError).
OOM_MESSAGES = ("does not fit in", "out of memory", "can't allocate memory")


@dataclass
class TrainRun:
    command: list[str]
    returncode: int | None  # None: stopped at the timeout
    elapsed_s: float
    records: list[dict] = field(default_factory=list)
    output_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def out_of_memory(self) -> bool:
        killed = killed_rank(self.output_tail)
        return not self.ok and (any(m in self.output_tail for m in OOM_MESSAGES) or self.returncode == -signal.SIGKILL
                                or (killed is not None and killed[1] == signal.SIGKILL))

    def failure(self) -> str:
        """Why it failed, in one line: train.py's own `error:` line; else the signal that ended it (the process, or
        under torchrun the root-cause rank in torchrun's failure table), SIGKILL read as the likely out-of-memory
        kill it usually is; else the first line naming an exception, never a traceback's source line."""
        if self.timed_out:
            return f"stopped after {self.elapsed_s:.0f}s (time limit)"
        lines = [line.strip() for line in self.output_tail.splitlines() if line.strip(" =-\n")]
        own = [line for line in lines if line.startswith("error:")]
        if own:
            return f"exit code {self.returncode}: {own[0]}"
        killed = killed_rank(self.output_tail)
        if killed is not None:
            rank, signum = killed
            return f"rank {rank} {by_signal(signum)}"
        if self.returncode is not None and self.returncode < 0:
            return f"train.py {by_signal(-self.returncode)}"
        # torchrun ends its report with a banner of '='; else the telling line names an exception or a signal.
        telling = [line for line in lines if any(word in line for word in ("Error", "terminate called", "Signal "))
                   and not line.startswith("raise ") and not line.startswith("File ")]
        return f"exit code {self.returncode}: {(telling or lines or [''])[0 if telling else -1]}"

    @property
    def step_records(self) -> list[dict]:
        return [r for r in self.records if "tokens_per_s" in r]

    def timed_windows(self, skip: int = 1) -> list[dict]:
        """The log windows after the first `skip` (warm-up: allocator, thread pools, first collectives)."""
        return self.step_records[skip:]


# torchrun's failure table (torch/distributed/elastic/multiprocessing/errors): the root cause's rank and exit code,
# negative for a signal.
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def killed_rank(output: str) -> tuple[int, int] | None:
    """The rank a signal ended and the signal's number, from torchrun's root-cause table (None: no rank was)."""
    found = ROOT_CAUSE.search(output)
    if found is None or int(found.group(2)) >= 0:
        return None
    return int(found.group(1)), -int(found.group(2))


def by_signal(signum: int) -> str:
    """`killed by SIGKILL (signal 9): likely out of memory` -- the kernel's OOM killer sends SIGKILL, and nothing
    else on a user's machine usually does."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return (f"killed by {name} (signal {signum})"
            f"{': likely out of memory (the kernel OOM killer sends SIGKILL; see dmesg)' if signum == signal.SIGKILL else ''}")


def train_command(config: TrainConfig, nproc: int | None = None, *launcher: str) -> list[str]:
    """train.py's command line for `config` (its flags that differ from the defaults): one process, or `nproc` ranks
    under torchrun with its own flags `launcher` besides."""
    if nproc is None:
        return [sys.executable, str(TRAIN_SCRIPT), *non_default_flags(config)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *launcher,
            str(TRAIN_SCRIPT), *non_default_flags(config)]


def run_train(out_dir: Path, config: TrainConfig, nproc: int | None = None, threads: int | None = None,
              timeout_s: float | None = None) -> TrainRun:
    """Train `config` into a fresh `out_dir`; `nproc` launches that many ranks with torchrun (None: one plain
    process).  `threads` sets OMP_NUM_THREADS per process.  A typed config, not flag strings: a misspelt or
    impossible setting fails here, before any process starts."""
    out_dir = Path(out_dir)
    if is_training_checkpoint(out_dir):
        raise ValueError(f"{out_dir} already holds a training run; remove it or choose another folder")
    if (out_dir / "metrics.jsonl").exists():
        (out_dir / "metrics.jsonl").unlink()  # a rerun must not read a failed earlier run's records
    command = train_command(dataclasses.replace(config, out_dir=str(out_dir)), nproc)
    done = run_command(command, threads=threads, timeout_s=timeout_s, stderr=STDOUT)
    metrics = out_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] \
        if metrics.exists() else []
    return TrainRun(command, done.returncode, done.seconds, records, done.stdout[-3000:])


def window_summary(windows: list[dict], key: str) -> Spread | None:
    """Median, min and max of one metric over the timed log windows (None when train.py did not log it)."""
    values = [w[key] for w in windows if w.get(key) is not None]
    return Spread.of(values) if values else None
