"""Stop beyond the grace: GPT-2 Medium under `torchrun --nproc_per_node=4` on the CPU, whose one micro-batch (batch 1)
outlasts torchrun's 30 s grace on a 2-core host, is sent a Ctrl-C (to the whole job, as a terminal sends it) in the
middle of step 2, once per layout: tp at --block-size 1024, fsdp at 256 (its four data-parallel ranks' micro-batch then
holds the same 1024 tokens as tp's one), both with --activation-checkpointing, to leave room on a 24 GB host shared with
other work (it makes the micro-batch longer, never shorter).  train.py saves the first step of a run whose micro-batch
takes half the grace or more (a consolidated Medium save alone can outlast the grace on a busy host), so the Ctrl-C
comes half a micro-batch after that save.  A failure is a job that leaves anything but step 1 on disk, lacks the one
closing line, has a rank SIGKILLed by torchrun, or whose resumed run's losses differ from a run never stopped.  Work
lost: the part of step 2 done before the stop.  Its notes give the micro-batch, the save's time and how long the job
took to end after the Ctrl-C.

    python -m bench.drills.stop_beyond_grace        # about 25 min on 2 CPU cores; bench/results/stop_beyond_grace.json
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.drills.drill import Drill, DrillSettings, logged_losses, saved_step
from bench.experiment import ExperimentError
from bench.processes import Finished, start
from bench.record import RESULTS_DIR, write_result
from runtime.cli import entry_point
from runtime.timing import Environment, environment, matmul_rate

MODEL = "gpt2-medium"
BLOCK = {"tp": 1024, "fsdp": 256}
RANKS = 4
STEPS = 2


def command(mode: str, out: Path, *flags: str, grace_s: int = 30) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}",
            f"--shutdown-timeout={grace_s}", "train.py",
            "--model", MODEL, "--parallel", mode, "--batch-size", "1", "--block-size", str(BLOCK[mode]),
            "--max-steps", str(STEPS), "--log-interval", "1", "--final-eval-batches", "1", "--dataset", "builtin",
            "--device", "cpu", "--activation-checkpointing", "--no-curves", "--out-dir", str(out), *flags]


def finished(mode: str, out: Path, *flags: str) -> Finished:
    done = start(command(mode, out, *flags), threads=1, own_session=True).finish(timeout_s=3600)
    if not done.ok:
        raise ExperimentError(f"{mode}: {' '.join(command(mode, out, *flags)[3:])} failed: {done.stderr[-600:]}")
    return done


def seconds(pattern: str, text: str) -> float | None:
    found = re.search(pattern, text)
    return float(found.group(1)) if found else None


def stop_in_step_2(mode: str, out: Path, grace_s: int) -> tuple[Finished, float, float]:
    """The job stopped halfway through step 2's micro-batch (timed by step 1's); returns it, the micro-batch's time
    and the seconds from the Ctrl-C to the job's end."""
    job = start(command(mode, out, grace_s=grace_s), threads=1, own_session=True)
    micro_batch_s = save_s = None
    for line in job.stdout:
        micro_batch_s = seconds(r"^first micro-batch ([\d.]+) s", line) or micro_batch_s
        save_s = seconds(r"^step 1: checkpoint saved in ([\d.]+) s", line)
        if save_s is not None:  # the step a stop finds on disk (train.py saves the first step of so long a run)
            break
    if micro_batch_s is None or save_s is None:
        job.kill_all()
        raise ExperimentError(f"{mode}: the job ended before step 1 was saved: {job.finish().stderr[-600:]}")
    time.sleep(micro_batch_s / 2)
    sent = time.perf_counter()
    os.killpg(job.pid, signal.SIGINT)
    done = job.finish(timeout_s=600)
    return done, micro_batch_s, save_s, time.perf_counter() - sent


def trial(mode: str, work: Path, grace_s: int) -> tuple[bool, str]:
    reference, out = work / f"grace-{mode}-reference", work / f"grace-{mode}"
    for folder in (reference, out):
        shutil.rmtree(folder, ignore_errors=True)
    finished(mode, reference)
    expected = logged_losses(reference)
    shutil.rmtree(reference)  # 4.3 GB of weights and optimizer state
    done, micro_batch_s, save_s, exit_s = stop_in_step_2(mode, out, grace_s)
    closing = [line for line in done.stderr.splitlines() if line.startswith("stopped by")]
    on_disk = saved_step(out)
    killed = "forcefully exiting" in done.stderr
    if on_disk == 1:
        finished(mode, out, "--resume")
    got = logged_losses(out)
    shutil.rmtree(out)
    ok = len(closing) == 1 and on_disk == 1 and not killed and got == expected
    note = (f"{mode} (block {BLOCK[mode]}, torchrun --shutdown-timeout {grace_s}): micro-batch {micro_batch_s:.0f} s; Ctrl-C at its middle; step {on_disk} on "
            f"disk (saved after step 1 in {save_s:.0f} s); job ended {exit_s:.0f} s after the Ctrl-C"
            f"{'; a rank was SIGKILLed' if killed else ''}; resumed losses "
            f"{'equal to' if got == expected else 'DIFFERENT from'} the run never stopped ({got} vs {expected})"
            f"{'' if len(closing) == 1 else f'; {len(closing)} closing lines'}"
            f"{'' if ok else '; its last lines: ' + ' | '.join(done.stderr.strip().splitlines()[-4:])[-600:]}")
    return ok, note


def run(s: DrillSettings, work: Path) -> Drill | None:
    if not s.grace_modes:
        return None
    started = time.perf_counter()
    outcomes = [trial(mode, work, s.grace_s) for mode in s.grace_modes]
    return Drill(f"{MODEL} x{RANKS} stopped beyond the grace", len(outcomes), sum(not ok for ok, _ in outcomes),
                 "part of 1 step per stop", time.perf_counter() - started, [note for _, note in outcomes])


@dataclass
class StopBeyondGrace:
    drill: Drill
    read_gb_per_s: list[float]  # the host's memory read rate and matmul rate, measured before the drill
    matmul_gflops: list[float]
    environment: Environment


def checkpoint_cost_note(save_s: list[float]) -> str:
    """What --checkpoint-minutes' default costs at the measured save times, for its justification."""
    from training.config import TrainConfig
    minutes = TrainConfig().checkpoint_minutes
    worst = max(save_s)
    return (f"--checkpoint-minutes {minutes:g} (the default): a save here took {', '.join(f'{s:.0f}' for s in save_s)} "
            f"s, so saving every {minutes:g} min costs at most {worst / (minutes * 60 + worst):.1%} of the run's time, "
            f"and a SIGKILL loses at most {minutes:g} min of training")


@entry_point(interrupted="the drill's job is stopped with it; nothing was recorded")
def main(argv: list[str] | None = None) -> None:
    """`[GRACE_S [MODE ...]]`: run the drill alone and write its result, bench/results/stop_beyond_grace.json (the
    fault-drill experiment runs it among the others with `--grace-modes`)."""
    from bench.peers.host_rates import read_bandwidth
    argv = sys.argv[1:] if argv is None else argv
    if argv and not argv[0].isdigit():
        raise ExperimentError(f"the first argument is the grace in whole seconds, got {argv[0]!r}")
    grace_s, modes = (int(argv[0]) if argv else 30), argv[1:] or ["tp", "fsdp"]
    host = read_bandwidth(), matmul_rate(2048)
    result = run(DrillSettings(grace_modes=modes, grace_s=grace_s), Path("out/bench/stop_beyond_grace"))
    save_s = [float(v) for v in re.findall(r"saved after step 1 in ([\d.]+) s", " ".join(result.notes))]
    if save_s:
        result.notes.append(checkpoint_cost_note(save_s))
    print("\n".join(result.notes))
    write_result(RESULTS_DIR, "stop_beyond_grace", StopBeyondGrace(result, *host, environment(torch.device("cpu"))))


if __name__ == "__main__":  # python -m bench.drills.stop_beyond_grace [GRACE_S [MODE ...]]
    main()
