"""Run the whole benchmark -- a fresh demo-sized training run, its scorecard, the seven experiments,
the int8 scorecard -- and write bench/REPORT.md.  `make bench` runs `--quick`.

    python bench/run_all.py --quick --leaderboard-dataset /path/to/wikitext-103-raw   # under 20 min on 2 CPU cores
    python bench/run_all.py                                                           # more steps and repeats

The scorecard is taken on a checkpoint this script trains itself (tiny preset, built-in corpus, into
out/bench/train), so the report does not depend on whatever else is in out/.  Each stage is its own
process (so each one's peak memory is its own); a stage that fails is recorded, the others still run,
the report is still written, and the exit code is non-zero.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.record import RESULTS_DIR, read_result, write_result
from bench.report import REPORT, write_report
from bench.runner import ROOT, run_train

WORK = Path("out/bench")
QUICK = {
    "train_steps": 100,
    "leaderboard": ["--repeats", "3", "--train-steps", "2"],
    "batch_sweep": ["--block-size", "128", "--max-batch", "128", "--steps", "1", "--repeats", "2"],
    "data_loading": ["--batches", "200", "--repeats", "3"],
    "phase_profile": ["--block-size", "128", "--steps", "20"],
    "precision_memory": ["--block-size", "128", "--steps", "8", "--timeout-s", "180"],
    "comm_strategies": ["--block-size", "64", "--global-batch", "8", "--steps-per-window", "2", "--windows", "2"],
    "tp_vs_fsdp": ["--block-size", "64", "--global-batches", "2", "4", "8", "16", "--steps-per-window", "2",
                   "--windows", "2"],
    "compression": ["--methods", "magnitude", "row", "--rounds", "2", "--finetune-steps", "10", "--eval-batches", "4",
                    "--block-size", "128", "--speed-repeats", "2"],
}
FULL = {
    "train_steps": 1000,
    "leaderboard": ["--repeats", "5", "--train-steps", "5"],
    "batch_sweep": ["--max-batch", "256", "--steps", "3", "--repeats", "3"],
    "data_loading": ["--batches", "1000", "--repeats", "5"],
    "phase_profile": ["--steps", "100", "--eval-interval", "25"],
    "precision_memory": ["--steps", "50", "--timeout-s", "900"],
    "comm_strategies": ["--block-size", "256", "--global-batch", "16", "--steps-per-window", "5", "--windows", "3"],
    "tp_vs_fsdp": ["--block-size", "256", "--global-batches", "2", "4", "8", "16", "32", "--steps-per-window", "5",
                   "--windows", "3"],
    "compression": ["--methods", "magnitude", "row", "wanda", "--rounds", "4", "--finetune-steps", "50",
                    "--eval-batches", "16"],
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--quick", action="store_true", help="settings that finish in under 20 minutes on 2 CPU cores")
    parser.add_argument("--leaderboard-dataset", default="wikitext-103",
                        help="the scorecard's evaluation text (dataset name or local folder); `builtin` is "
                             "accepted and the report says it is not WikiText-103")
    parser.add_argument("--only", nargs="+", help="run only these stages (the report uses the results already there)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--report", type=Path, default=REPORT)
    return parser.parse_args(argv)


def text_note(dataset: str) -> str:
    if dataset == "builtin":
        return ("the built-in corpus (Python standard library documentation), NOT WikiText-103: the WikiText-103 "
                "validation text was not available on this machine, so the loss is not comparable with the "
                "reference leaderboard's")
    if Path(dataset).is_dir():
        return f"WikiText-103 validation split read from the local folder `{dataset}`"
    return f"the `{dataset}` validation split"


def script(name: str, *flags: str) -> list[str]:
    return [sys.executable, str(ROOT / "bench" / f"{name}.py"), *flags]


def main(argv=None) -> None:
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    results = ["--results-dir", str(args.results_dir)]
    checkpoint = WORK / "train"
    int8 = WORK / "compression" / "int8"
    stages = {
        "leaderboard": script("leaderboard", "--checkpoint", str(checkpoint), "--dataset", args.leaderboard_dataset,
                              *settings["leaderboard"], "--out", str(args.results_dir / "leaderboard.json")),
        **{name: script(name, *settings[name], *results)
           for name in ("batch_sweep", "data_loading", "phase_profile")},
        "precision_memory": script("precision_memory", *settings["precision_memory"], "--work-dir",
                                   str(WORK / "precision_memory"), *results),
        **{name: script(name, *settings[name], "--work-dir", str(WORK / "parallel"), *results)
           for name in ("comm_strategies", "tp_vs_fsdp")},
        "compression": script("compression", "--checkpoint", str(checkpoint), *settings["compression"],
                              "--work-dir", str(WORK / "compression"), *results),
        "leaderboard_int8": script("leaderboard", "--checkpoint", str(int8), "--dataset", args.leaderboard_dataset,
                                   *settings["leaderboard"], "--out", str(args.results_dir / "leaderboard_int8.json")),
    }
    wanted = set(args.only or ["train", *stages])
    unknown = wanted - {"train", *stages}
    if unknown:
        sys.exit(f"error: unknown stage(s) {sorted(unknown)}; choose from train, {', '.join(stages)}")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    record, failed = [], []

    if "train" in wanted:
        shutil.rmtree(checkpoint, ignore_errors=True)  # the benchmark's own checkpoint from last time
        print(f"== train: tiny preset, {settings['train_steps']} steps on the built-in corpus -> {checkpoint}", flush=True)
        run = run_train(checkpoint, {"model": "tiny", "dataset": "builtin", "max_steps": settings["train_steps"],
                                     "eval_interval": settings["train_steps"], "log_interval": 50})
        record.append({"name": "train", "seconds": run.elapsed_s, "ok": run.ok, "command": " ".join(run.command)})
        if not run.ok:
            failed.append("train")
            print(run.output_tail, file=sys.stderr)
    for name, command in stages.items():
        if name not in wanted:
            continue
        print(f"== {name}: {' '.join(command)}", flush=True)
        t0 = time.perf_counter()
        ok = subprocess.run(command, cwd=ROOT).returncode == 0
        record.append({"name": name, "seconds": time.perf_counter() - t0, "ok": ok, "command": " ".join(command)})
        if not ok:
            failed.append(name)
            print(f"== {name} failed; going on with the others", file=sys.stderr, flush=True)

    previous = read_result(args.results_dir, "run_all") if args.only else None
    if previous:  # a partial rerun: keep the full run's record, with these stages replaced
        rerun = {stage["name"] for stage in record}
        record = [s for s in previous["stages"] if s["name"] not in rerun] + record
        failed = sorted(set(previous["failed"]) - rerun | set(failed))
        started = f"{previous['started']}; re-ran {', '.join(sorted(rerun))} at {started}"
    write_result(args.results_dir, "run_all", {
        "command": previous["command"] if previous else
        " ".join(["python bench/run_all.py", *(sys.argv[1:] if argv is None else argv)]),
        "mode": "--quick (sized for 2 CPU cores, under 20 minutes)" if args.quick else "full",
        "started": started, "total_s": sum(stage["seconds"] for stage in record), "stages": record, "failed": failed,
        "checkpoint": str(checkpoint), "leaderboard_dataset": args.leaderboard_dataset,
        "leaderboard_text_note": text_note(args.leaderboard_dataset),
        "note": f"The scorecard's checkpoint is trained here: tiny preset, {settings['train_steps']} steps on the "
                f"built-in corpus (Python documentation), so its WikiText loss is that of a model that never saw "
                f"Wikipedia." + (f" Failed stages: {', '.join(failed)}." if failed else "")})
    write_report(args.results_dir, args.report)
    if failed:
        sys.exit(f"error: stage(s) failed: {', '.join(failed)} (see above); the report marks what is missing")


if __name__ == "__main__":
    main()
