"""`make demo` and `make smoke`: the whole tour -- train, sample, serve, prune, quantize, FSDP, scorecard -- in
stages that a stopped run continues.

    python -m bench.demo                       # make demo: out/demo
    python -m bench.demo --sizes smoke         # make smoke: every stage on the smallest sizes, out/smoke

Each stage says what it does and how long it should take, then runs its command.  A stage whose output is complete
and valid is skipped: its artifact loads (storage/, the one loader) and says it is finished (the training run's step
is its last; the pruning report is finished; the int8 report is measured); a text output exists only once its
command has succeeded (it is written beside and renamed into place).  A training run stopped midway continues from
its last checkpoint (`--resume auto`).  So a demo stopped anywhere (Ctrl-C, SIGTERM, a closed laptop) continues where
it stopped; `make clean` starts over.

The estimate of a stage is what it took the last time it ran to the end on this machine (kept in the output folder),
else what it took in the committed measurement (bench/results/demo_time.json: its host and load are stated there);
the tools print their own estimates once they start.
"""
from __future__ import annotations

if __name__ == "__main__":  # first: a stop sent while the imports below take seconds is noted (runtime/stopping.py)
    from runtime.stopping import note_stops_while_starting
    note_stops_while_starting()

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from bench.processes import INHERIT, PIPE, ROOT, start
from bench.record import write_result
from runtime.cli import entry_point, option, parse_config
from runtime.errors import UserError
from runtime.progress import duration
from runtime.stopping import Stopped, leaving, signals_held
from runtime.timing import Spread, environment, matmul_rate
from storage.artifact import load_model
from storage.folder import write_durably

RECORDED = ROOT / "bench" / "results" / "demo_time.json"
TIMES_FILE = ".stage_seconds.json"  # in the output folder: each stage's time when it last ran to the end here
PROMPT = "The module"


class DemoError(UserError):
    pass


@dataclass(frozen=True)
class Sizes:
    """How big each stage's work is."""
    train_steps: int
    train_flags: tuple[str, ...]
    eval_interval: int
    sample_tokens: int
    prune_flags: tuple[str, ...]
    quantize_flags: tuple[str, ...]
    fsdp_steps: int
    scorecard_flags: tuple[str, ...]
    serve_tokens: int
    configs: bool  # each tool starts from its file in configs/demo/ (the demo's settings live there), flags on top


SIZES = {
    # The tiny model, long enough to produce words; the evaluation and timing settings of the old one-line demo.
    # The sizes not given here are configs/demo/*.toml's.
    "demo": Sizes(train_steps=200, train_flags=(), eval_interval=50, sample_tokens=60, prune_flags=(),
                  quantize_flags=(), fsdp_steps=20, scorecard_flags=(), serve_tokens=40, configs=True),
    # Every stage once, as small as it still works: a check that the whole tour runs, not a demonstration.
    "smoke": Sizes(train_steps=10, train_flags=("--batch-size", "4", "--block-size", "64", "--eval-batches", "2",
                                                "--final-eval-batches", "2"), eval_interval=5, sample_tokens=10,
                   prune_flags=("--rounds", "1", "--finetune-steps", "2", "--batch-size", "2", "--block-size", "32",
                                "--eval-batches", "1", "--speed-repeats", "1", "--generation-tokens", "2",
                                "--speed-batch", "1", "--speed-seq-len", "16"),
                   quantize_flags=("--eval-batches", "1", "--eval-batch-size", "2", "--repeats", "1",
                                   "--new-tokens", "4", "--prompt-tokens", "8"),
                   # The scorecard's loss is over all of its text: a small one (the Makefile's ~2,000 tokens, always
                   # there) instead of the built-in validation split's 47,000, which took most of the smoke's time.
                   fsdp_steps=4, scorecard_flags=("--eval-text", str(ROOT / "Makefile"), "--new-tokens", "4",
                                                  "--repeats", "1", "--train-steps", "1", "--block-size", "32",
                                                  "--eval-block-size", "64"),
                   serve_tokens=8, configs=False),
}


@dataclass
class DemoConfig:
    sizes: str = option("demo", "demo (the tour, `make demo`) or smoke (every stage on the smallest sizes, "
                                "`make smoke`)", choices=tuple(SIZES))
    out_dir: str | None = option(None, "where the stages write (default: out/demo, or out/smoke for --sizes smoke)")
    record: bool = option(False, f"after a run in which every stage ran, write its stage times and wall time, with "
                                 f"this host's load, read rate and matmul rate, to {RECORDED.relative_to(ROOT)} "
                                 f"(the estimates' source on a machine that has not run the demo)")


@dataclass
class Stage:
    name: str
    says: str  # what it does, for the user
    command: list[str]
    done: Callable[[], bool]  # whether its output is complete and valid
    output: Path | None = None  # where its standard output goes (written once the command succeeded)
    env: dict | None = None


def finished_training(folder: Path, steps: int) -> Callable[[], bool]:
    def done() -> bool:
        return loaded(folder, lambda meta: meta.step == steps)
    return done


def finished_report(folder: Path, kind: str, report: str, finished: Callable[[dict], bool]) -> Callable[[], bool]:
    def done() -> bool:
        try:
            return loaded(folder, lambda meta: meta.kind == kind) and finished(json.loads((folder / report).read_text()))
        except (OSError, ValueError):
            return False
    return done


def loaded(folder: Path, holds: Callable) -> bool:
    """Whether the artifact loader reads `folder` whole and its metadata `holds`."""
    if not (folder / "config.json").exists():
        return False
    try:
        return bool(holds(load_model(folder)[1]))
    except UserError as e:  # damaged or half there: the stage runs again (its tool says what it does with it)
        print(f"  {folder}: {e}; running the stage again", file=sys.stderr)
        return False


def finished_scorecard(path: Path) -> Callable[[], bool]:
    """The scorecard writes each figure as it is measured (bench/eval/score_file.py): a failed or stopped run leaves
    a file whose `complete` is false, and the stage runs again (a file from before the statuses was only ever
    written whole)."""
    def done() -> bool:
        try:
            return json.loads(path.read_text()).get("complete", True) is True
        except (OSError, ValueError, AttributeError):
            return False
    return done


def text_written(path: Path) -> Callable[[], bool]:
    return lambda: path.is_file() and path.stat().st_size > 0


def stages(sizes: Sizes, out: Path) -> list[Stage]:
    python = sys.executable
    train, prune, int8 = out / "train", out / "prune-row", out / "int8"

    def config(name: str) -> list[str]:
        return ["--config", f"configs/demo/{name}.toml"] if sizes.configs else []
    return [
        Stage("train", f"train the tiny GPT-2 for {sizes.train_steps} steps on the built-in corpus into {train} "
                       f"(a stopped run continues from its last checkpoint)",
              [python, "train.py", *config("train"), "--model", "tiny", "--dataset", "builtin", "--max-steps", str(sizes.train_steps),
               "--eval-interval", str(sizes.eval_interval), *sizes.train_flags, "--out-dir", str(train),
               "--resume", "auto"],
              finished_training(train, sizes.train_steps)),
        Stage("sample", f"two samples from the trained model -> {out / 'sample.txt'}",
              [python, "sample.py", "--checkpoint", str(train), "--prompt", PROMPT, "--num-samples", "2",
               "--max-new-tokens", str(sizes.sample_tokens), "--seed", "1"],
              text_written(out / "sample.txt"), output=out / "sample.txt"),
        Stage("serve", f"start the server on it, send one request, print the reply -> {out / 'serve.txt'}",
              [python, "-m", "serve.demo", "--checkpoint", str(train), "--max-new-tokens", str(sizes.serve_tokens)],
              text_written(out / "serve.txt"), output=out / "serve.txt"),
        Stage("prune", f"remove half of the heads and MLP units in rounds, fine-tuning after each -> {prune}",
              [python, "prune/iterative.py", *config("prune"), "--method", "row", "--target", "0.5", *sizes.prune_flags,
               "--checkpoint", str(train), "--out-dir", str(prune), "--overwrite"],
              finished_report(prune, "pruned", "prune_report.json",
                              lambda report: report["methods"]["row"]["finished"])),
        Stage("quantize", f"int8 weights, measured against the float model -> {int8}",
              [python, "quantize/dynamic.py", *config("quantize"), "--checkpoint", str(train), "--out-dir", str(int8), "--overwrite",
               *sizes.quantize_flags],
              finished_report(int8, "int8", "quant_report.json", lambda report: report["measured"] is True)),
        Stage("sample-int8", f"a sample from the int8 model -> {out / 'sample-int8.txt'}",
              [python, "sample.py", "--checkpoint", str(int8), "--prompt", PROMPT, "--num-samples", "1",
               "--max-new-tokens", str(sizes.sample_tokens), "--seed", "1"],
              text_written(out / "sample-int8.txt"), output=out / "sample-int8.txt"),
        Stage("fsdp", f"{sizes.fsdp_steps} steps of the same model sharded with FSDP over 2 processes (torchrun) "
                      f"-> {out / 'fsdp'}",
              [python, "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py", *config("train-fsdp"), "--parallel", "fsdp",
               "--model", "tiny", "--max-steps", str(sizes.fsdp_steps), "--block-size", "64", "--batch-size", "4",
               "--log-interval", str(max(1, sizes.fsdp_steps // 2)), "--eval-interval", "1000",
               "--final-eval-batches", "4", "--out-dir", str(out / "fsdp"), "--resume", "auto"],
              finished_training(out / "fsdp", sizes.fsdp_steps), env={"OMP_NUM_THREADS": "1"}),
        Stage("scorecard", f"the leaderboard scorecard of the trained model -> {out / 'scorecard.json'}",
              [python, "bench/leaderboard.py", *config("scorecard"), "--checkpoint", str(train), *sizes.scorecard_flags,
               "--out", str(out / "scorecard.json")],
              finished_scorecard(out / "scorecard.json")),
    ]


def read_times(path: Path) -> dict[str, float]:
    try:
        return {name: float(s) for name, s in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):  # none yet, or not ours: estimates come from the recording
        return {}


def recorded_times(sizes: str) -> tuple[dict[str, float], str]:
    """The committed measurement's stage times for `sizes`, and where it was made."""
    try:
        recording = json.loads(RECORDED.read_text())[sizes]
    except (OSError, ValueError, KeyError):
        return {}, ""
    return recording["stage_seconds"], recording["host"]


def estimate(name: str, here: dict[str, float], recorded: dict[str, float], host: str) -> str:
    if name in here:
        return f"about {duration(here[name])} (its last run here)"
    if name in recorded:
        return f"about {duration(recorded[name])} on {host} (bench/results/demo_time.json)"
    return "not measured yet; the tool prints its own estimate"


def run_stage(stage: Stage) -> None:
    """Its command, with the terminal; standard output into `stage.output` when it has one (renamed into place
    only once the command succeeded, so a stopped stage leaves no output that looks done).  The command runs in a
    session of its own, so a stop reaches it once, from here: it stops as it does (train.py saves its last whole
    step), and a second stop kills it."""
    process = None
    try:
        with signals_held():  # a stop while it starts comes once it is known, below
            process = start(stage.command, cwd=ROOT, env=stage.env, stdout=PIPE if stage.output else INHERIT,
                            stderr=INHERIT, own_session=True)
        stdout, _ = process.communicate()
    except KeyboardInterrupt as e:
        if process is None:  # it never started
            raise
        stop = Stopped.of(e)
        try:
            process.send_signal(stop.signum)
            process.communicate()
        finally:
            process.kill_all()
        raise stop from None
    finally:
        if process is not None:
            process.kill_all()  # anything of its session left behind (torchrun's ranks)
    if process.returncode != 0:
        raise DemoError(f"stage {stage.name} failed (exit status {process.returncode}): {' '.join(stage.command[1:])}; "
                        f"fix what it said and run the demo again (the finished stages are kept)")
    if stage.output is not None:
        sys.stdout.write(stdout)
        write_durably(stage.output, stdout)


def tour(cfg: DemoConfig) -> None:
    sizes = SIZES[cfg.sizes]
    out = Path(cfg.out_dir or f"out/{cfg.sizes}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DemoError(f"--out-dir {out} cannot be made a folder ({e.strerror}); choose another") from e
    times_path = out / TIMES_FILE
    here, (recorded, host) = read_times(times_path), recorded_times(cfg.sizes)
    plan = stages(sizes, out)
    if cfg.record and any(stage.done() for stage in plan):
        raise DemoError(f"--record times a run in which every stage runs, and {out} holds finished stages; give an "
                        f"empty --out-dir")
    started = time.perf_counter()
    for number, stage in enumerate(plan, 1):
        heading = f"== stage {number}/{len(plan)} {stage.name}: {stage.says}"
        if stage.done():
            print(f"{heading}: done already (its output is complete and valid), skipped", flush=True)
            continue
        print(f"{heading}; estimate {estimate(stage.name, here, recorded, host)}", flush=True)
        stage_start = time.perf_counter()
        with leaving(f"in stage {number}/{len(plan)} ({stage.name}); the finished stages are kept, and "
                     f"`make {'smoke' if cfg.sizes == 'smoke' else 'demo'}` continues from this one"):
            run_stage(stage)
        if not stage.done():
            raise DemoError(f"stage {stage.name} ended without a complete output in {out}; run the demo again")
        here[stage.name] = time.perf_counter() - stage_start
        times_path.write_text(json.dumps(here, indent=2) + "\n")
        print(f"== stage {number}/{len(plan)} {stage.name} took {duration(here[stage.name])}", flush=True)
    wall_s = time.perf_counter() - started
    print(f"== the tour is complete in {out} ({duration(wall_s)} this run)")
    if cfg.record:
        record(cfg.sizes, {stage.name: here[stage.name] for stage in plan}, wall_s)


def host_rates() -> dict:
    from bench.peers.host_rates import read_bandwidth
    return {"load_average_1m": os.getloadavg()[0], "read_gb_per_s": Spread.of(read_bandwidth()).median,
            "matmul_gflop_per_s": Spread.of(matmul_rate()).median}


def record(sizes: str, stage_seconds: dict[str, float], wall_s: float) -> None:
    """This run's times as the recorded estimate for `sizes` (the other sizes' record is kept)."""
    try:
        recorded = json.loads(RECORDED.read_text())
    except (OSError, ValueError):
        recorded = {}
    env = environment(torch.device("cpu"))
    recorded[sizes] = {"stage_seconds": stage_seconds, "wall_s": wall_s,
                       "host": f"a {env.cpu_count}-core {env.cpu} (load {env.load_average_1m:.1f} at the end)",
                       "environment": asdict(env), "host_rates_at_the_end": host_rates(),
                       "command": f"python -m bench.demo --sizes {sizes} --record (in an empty --out-dir; set-up, "
                                  f"the .venv and the tokenizer, not included)"}
    write_result(RECORDED.parent, RECORDED.stem, recorded)


@entry_point(interrupted="between stages; the finished stages are kept, and the demo continues from the next")
def main(argv=None) -> None:
    tour(parse_config(DemoConfig, __doc__, argv, prog="python -m bench.demo"))


if __name__ == "__main__":
    main()
