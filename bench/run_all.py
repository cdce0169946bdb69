"""Run the whole benchmark -- a fresh demo-sized training run, its scorecard, every experiment in the
registry, the int8 scorecard -- and write bench/REPORT.md.  `make bench` runs `--quick`.

    python bench/run_all.py --quick --leaderboard-dataset /path/to/wikitext-103-raw   # under 20 min on 2 CPU cores
    python bench/run_all.py                                                           # more steps and repeats
    python bench/run_all.py --quick --only batch_sweep data_loading                   # rerun some stages
    python bench/run_all.py --nanogpt /path/to/nanoGPT                  # train_speed measures nanoGPT beside us

On a CUDA machine (or with --profile gpu) it runs the GPU profile instead: the experiments that compare us
with a peer at GPU sizes (each one's `gpu` settings: training against nanoGPT in its bench.py configuration,
generation against transformers with and without a CUDA graph, serving against generate()) into
bench/results/gpu/, which the report shows as its GPU section beside the CPU figures already there.

The scorecard is taken on a checkpoint this script trains itself (tiny preset, built-in corpus, into
out/bench/train), so the report does not depend on whatever else is in out/; experiments with a
`checkpoint` setting (compression) get it too.  Each stage is its own process (so each one's peak
memory is its own); a stage that fails is recorded, the others still run, the report is still
written, and the exit code is non-zero.
"""
from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiment import WORK_ROOT, Workspace
from bench.eval.scorecard import LeaderboardConfig
from bench.experiments import EXPERIMENTS, find
from bench.record import RESULTS_DIR, gpu_results, read_result, write_result
from bench.report import REPORT, write_report
from bench.processes import INHERIT, ROOT, run_command
from bench.train_runs import run_train
from runtime.cli import entry_point, non_default_flags, option, parse_config
from runtime.errors import UserError
from training.config import TrainConfig

CHECKPOINT = WORK_ROOT / "train"
STAGES = ("train", "leaderboard", *(e.name for e in EXPERIMENTS), "leaderboard_int8")
TRAIN_STEPS = {"quick": 100, "full": 1000}
SCORECARD = {"quick": LeaderboardConfig(repeats=3, train_steps=2), "full": LeaderboardConfig(repeats=5, train_steps=5)}


@dataclass
class RunAllConfig:
    quick: bool = option(False, "settings that finish in under 20 minutes on 2 CPU cores")
    leaderboard_dataset: str = option("wikitext-103", "the scorecard's evaluation text (dataset name or local folder); `builtin` is accepted and the "
                                                      "report says it is not WikiText-103")
    only: list[str] | None = option(None, "run only these stages (the report uses the results already there)", choices=STAGES)
    results_dir: Path = option(RESULTS_DIR, "folder for every NAME.json and plot (the GPU profile's go to its gpu/ subfolder)")
    report: Path = option(REPORT, "the Markdown report to write")
    profile: str = option("auto", "cpu: the whole benchmark (--quick sizes it for 2 CPU cores); gpu: the peer comparisons at GPU "
                                  "sizes (--quick does not apply); auto: gpu where CUDA is available", choices=("auto", "cpu", "gpu"))
    nanogpt: str | None = option(None, "a karpathy/nanoGPT checkout: train_speed times its model.py and loop beside ours")


def text_note(dataset: str) -> str:
    if dataset == "builtin":
        return ("the built-in corpus (Python standard library documentation), NOT WikiText-103: the WikiText-103 "
                "validation text was not available on this machine, so the loss is not comparable with the "
                "reference leaderboard's")
    if Path(dataset).is_dir():
        return f"WikiText-103 validation split read from the local folder `{dataset}`"
    return f"the `{dataset}` validation split"


def scorecard_command(cfg: RunAllConfig, size: str, checkpoint: Path, name: str) -> list[str]:
    settings = dataclasses.replace(SCORECARD[size], checkpoint=str(checkpoint), dataset=cfg.leaderboard_dataset,
                                   out=cfg.results_dir / f"{name}.json")
    return [sys.executable, str(ROOT / "bench" / "leaderboard.py"), *non_default_flags(settings)]


def with_run_inputs(cfg: RunAllConfig, settings):
    """An experiment's settings with what this run provides: its checkpoint, a nanoGPT checkout."""
    names = {f.name for f in dataclasses.fields(settings)}
    if "checkpoint" in names:
        settings = dataclasses.replace(settings, checkpoint=str(CHECKPOINT))
    if "nanogpt" in names and cfg.nanogpt:
        settings = dataclasses.replace(settings, nanogpt=cfg.nanogpt)
    return settings


def stage_commands(cfg: RunAllConfig, size: str) -> dict[str, list[str]]:
    """Every stage after training, in order: the scorecard, the experiments, the int8 scorecard."""
    workspace = Workspace(cfg.results_dir)
    commands = {"leaderboard": scorecard_command(cfg, size, CHECKPOINT, "leaderboard")}
    for experiment in EXPERIMENTS:
        commands[experiment.name] = experiment.command(with_run_inputs(cfg, getattr(experiment, size)), workspace)
    int8 = find("compression").work_dir(workspace) / "int8"
    commands["leaderboard_int8"] = scorecard_command(cfg, size, int8, "leaderboard_int8")
    return commands


def gpu_stage_commands(cfg: RunAllConfig) -> dict[str, list[str]]:
    """The GPU profile: each experiment that has GPU settings, into the GPU results folder."""
    workspace = Workspace(gpu_results(cfg.results_dir))
    return {e.name: e.command(with_run_inputs(cfg, e.gpu), workspace) for e in EXPERIMENTS if e.gpu is not None}


def uses_gpu_profile(cfg: RunAllConfig) -> bool:
    if cfg.profile == "auto":
        return torch.cuda.is_available()
    if cfg.profile == "gpu" and not torch.cuda.is_available():
        raise UserError("--profile gpu needs a CUDA device and torch sees none; run --profile cpu here")
    return cfg.profile == "gpu"


def train(steps: int) -> dict:
    shutil.rmtree(CHECKPOINT, ignore_errors=True)  # the benchmark's own checkpoint from last time
    print(f"== train: tiny preset, {steps} steps on the built-in corpus -> {CHECKPOINT}", flush=True)
    run = run_train(CHECKPOINT, TrainConfig(model="tiny", dataset="builtin", max_steps=steps, eval_interval=steps,
                                            log_interval=50))
    if not run.ok:
        print(run.output_tail, file=sys.stderr)
    return {"name": "train", "seconds": run.elapsed_s, "ok": run.ok, "command": " ".join(run.command)}


def run_stage(name: str, command: list[str]) -> dict:
    print(f"== {name}: {' '.join(command)}", flush=True)
    done = run_command(command, stdout=INHERIT, stderr=INHERIT)
    if not done.ok:
        print(f"== {name} failed; going on with the others", file=sys.stderr, flush=True)
    return {"name": name, "seconds": done.seconds, "ok": done.ok, "command": " ".join(command)}


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(RunAllConfig, __doc__, argv)
    gpu = uses_gpu_profile(cfg)
    size = "quick" if cfg.quick else "full"
    commands = gpu_stage_commands(cfg) if gpu else stage_commands(cfg, size)  # checks every stage's settings
    wanted = set(cfg.only or STAGES)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results_dir = gpu_results(cfg.results_dir) if gpu else cfg.results_dir
    record = [train(TRAIN_STEPS[size])] if "train" in wanted and not gpu else []
    record += [run_stage(name, command) for name, command in commands.items() if name in wanted]
    failed = [stage["name"] for stage in record if not stage["ok"]]

    previous = read_result(results_dir, "run_all") if cfg.only else None
    if previous:  # a partial rerun: keep the full run's record, with these stages replaced
        rerun = {stage["name"] for stage in record}
        record = [s for s in previous["stages"] if s["name"] not in rerun] + record
        failed = sorted(set(previous["failed"]) - rerun | set(failed))
        started = f"{previous['started']}; re-ran {', '.join(sorted(rerun))} at {started}"
    command = previous["command"] if previous else \
        " ".join(["python bench/run_all.py", *(sys.argv[1:] if argv is None else argv)])
    failures = f" Failed stages: {', '.join(failed)}." if failed else ""
    summary = {"command": command, "started": started, "total_s": sum(stage["seconds"] for stage in record),
               "stages": record, "failed": failed}
    if gpu:
        summary |= {"mode": "GPU profile", "note": "Each experiment at its GPU settings." + failures}
    else:
        summary |= {
            "mode": "--quick (sized for 2 CPU cores, under 20 minutes)" if cfg.quick else "full",
            "checkpoint": str(CHECKPOINT), "leaderboard_dataset": cfg.leaderboard_dataset,
            "leaderboard_text_note": text_note(cfg.leaderboard_dataset),
            "note": f"The scorecard's checkpoint is trained here: tiny preset, {TRAIN_STEPS[size]} steps on the "
                    f"built-in corpus (Python documentation), so its WikiText loss is that of a model that never saw "
                    f"Wikipedia." + failures}
    write_result(results_dir, "run_all", summary)
    write_report(cfg.results_dir, cfg.report)
    if failed:
        sys.exit(f"error: stage(s) failed: {', '.join(failed)} (see above); the report marks what is missing")


if __name__ == "__main__":
    main()
