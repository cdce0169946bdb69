"""Experiment 7: compression -- prune/'s loss-against-sparsity curves and quantize/'s float-against-int8 table.

    python bench/compression.py --checkpoint out/bench/train          # runs prune/ and quantize/ on it
    python bench/compression.py --prune-report out/prune/prune_report.json --quant-report out/int8/quant_report.json

Either runs `prune/iterative.py` (one run per --methods, into one folder) and `quantize/dynamic.py`
on the checkpoint, or gathers reports they already wrote; then puts their figures side by side in
bench/results/compression.json and one plot.  The measuring is theirs: see prune/ and quantize/.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.record import add_results_arg, plt, save_figure, write_result
from bench.runner import ROOT, run_command
from bench.timing import environment
from runtime.device import choose_device
from training.checkpoint import default_checkpoint

NAME = "compression"
PRUNE_REPORT = "prune_report.json"
QUANT_REPORT = "quant_report.json"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--checkpoint", type=Path, help="float artifact to compress (default: newest under out/)")
    parser.add_argument("--prune-report", type=Path, help="gather this prune_report.json instead of running prune/")
    parser.add_argument("--quant-report", type=Path, help="gather this quant_report.json instead of running quantize/")
    parser.add_argument("--dataset", default="builtin", help="validation text for both tools")
    parser.add_argument("--methods", nargs="+", default=["magnitude", "row"], choices=["magnitude", "row", "wanda"])
    parser.add_argument("--target", type=float, default=0.5, help="final sparsity of the pruning runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--finetune-steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8, help="prune/: fine-tuning and evaluation batch")
    parser.add_argument("--block-size", type=int, help="prune/: fine-tuning and evaluation context")
    parser.add_argument("--eval-batches", type=int, default=8, help="validation batches for both tools")
    parser.add_argument("--speed-repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32, help="both tools: tokens per timed generation")
    parser.add_argument("--speed-seq-len", type=int, default=128, help="prune/: length of the timed forward passes")
    parser.add_argument("--timeout-s", type=float, default=900, help="per tool run")
    parser.add_argument("--work-dir", type=Path, default=Path("out/bench/compression"))
    add_results_arg(parser)
    return parser.parse_args(argv)


def run_tool(script: str, flags: list[str], timeout_s: float) -> str:
    command = [sys.executable, str(ROOT / script), *flags]
    print(" ".join(command), flush=True)
    returncode, output, _ = run_command(command, timeout_s=timeout_s)
    if returncode != 0:
        what = "timed out" if returncode is None else f"failed (exit code {returncode})"
        sys.exit(f"error: {script} {what}:\n{output[-2000:]}")
    return " ".join(command)


def produce_reports(args) -> tuple[Path, Path, list[str]]:
    checkpoint = args.checkpoint or default_checkpoint()[0]
    commands = []
    prune_report, quant_report = args.prune_report, args.quant_report
    if prune_report is None:
        prune_dir = args.work_dir / "prune"
        if (prune_dir / PRUNE_REPORT).exists():
            (prune_dir / PRUNE_REPORT).unlink()  # the report accumulates methods: start from none
        for method in args.methods:
            flags = ["--checkpoint", str(checkpoint), "--method", method, "--target", str(args.target),
                     "--rounds", str(args.rounds), "--finetune-steps", str(args.finetune_steps),
                     "--batch-size", str(args.batch_size), "--eval-batches", str(args.eval_batches),
                     "--speed-repeats", str(args.speed_repeats), "--speed-seq-len", str(args.speed_seq_len),
                     "--generation-tokens", str(args.new_tokens), "--dataset", args.dataset,
                     "--out-dir", str(prune_dir)]
            if args.block_size:
                flags += ["--block-size", str(args.block_size)]
            commands.append(run_tool("prune/iterative.py", flags, args.timeout_s))
        prune_report = prune_dir / PRUNE_REPORT
    if quant_report is None:
        quant_dir = args.work_dir / "int8"
        flags = ["--checkpoint", str(checkpoint), "--out-dir", str(quant_dir), "--dataset", args.dataset,
                 "--eval-batches", str(args.eval_batches), "--repeats", str(args.speed_repeats),
                 "--new-tokens", str(args.new_tokens)]
        if args.block_size:
            flags += ["--eval-block-size", str(args.block_size)]
        commands.append(run_tool("quantize/dynamic.py", flags, args.timeout_s))
        quant_report = quant_dir / QUANT_REPORT
    return prune_report, quant_report, commands


def read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        sys.exit(f"error: {path} does not exist; run {what} first or leave the flag out to run it here")
    return json.loads(path.read_text())


def gather(prune: dict, quant: dict) -> dict:
    curves = {}
    for method, entry in prune["methods"].items():
        curves[method] = {
            "finetune_steps": entry["finetune_steps"], "dataset": entry["dataset"], "eval": entry["eval"],
            "dense_control": entry.get("dense_control"),
            "rounds": [{"sparsity": r["sparsity_pruned_tensors"], "val_loss": r["val_loss"],
                        "val_loss_after_pruning": r["val_loss_after_pruning"], "parameters": r["parameters"],
                        "nonzero_parameters": r["nonzero_parameters"], "forward_speedup": r["forward_speedup"],
                        "generation_speedup": r["generation_speedup"]} for r in entry["rounds"]]}
    validation, generation = quant["validation"], quant["generation"]
    table = {
        "val_loss": {"float": validation["float"]["val_loss"], "int8": validation["int8"]["val_loss"],
                     "change_pct": validation["loss_increase_pct"]},
        "next_token_agreement": validation["next_token_agreement"],
        **{key: {"float": row["float_tokens_per_s"], "int8": row["int8_tokens_per_s"], "speedup": row["speedup"]}
           for key, row in ((f"tokens_per_s_{k}", v) for k, v in generation.items() if k.startswith("batch_"))},
        "generation_settings": {k: generation[k] for k in ("prompt_tokens", "new_tokens", "repeats") if k in generation},
        "size_bytes": {**quant["size_bytes"], "ratio": quant["size_bytes"]["int8"] / quant["size_bytes"]["float"]},
        "greedy_identical_tokens": quant["greedy"]["identical_tokens"],
    }
    return {"pruning": curves, "quantization": table, "quantization_dataset": quant["dataset"],
            "quantization_environment": quant["environment"]}


def plot(result: dict, path) -> str:
    fig, (curves, bars) = plt.subplots(1, 2, figsize=(11, 4))
    for method, entry in result["pruning"].items():
        rounds = entry["rounds"]
        curves.plot([r["sparsity"] for r in rounds], [r["val_loss"] for r in rounds], marker="o", label=method)
    curves.set_xlabel("sparsity of the pruned tensors")
    curves.set_ylabel("validation loss (after fine-tuning)")
    curves.set_title("pruning")
    curves.grid(alpha=0.3)
    curves.legend()
    quant = result["quantization"]
    keys = sorted((k for k in quant if k.startswith("tokens_per_s_")), key=lambda k: int(k.rsplit("_", 1)[1]))
    labels = [k.replace("tokens_per_s_", "").replace("_", " ") for k in keys]
    xs = range(len(keys))
    bars.bar([x - 0.2 for x in xs], [quant[k]["float"] for k in keys], width=0.4, label="float")
    bars.bar([x + 0.2 for x in xs], [quant[k]["int8"] for k in keys], width=0.4, label="int8")
    bars.set_xticks(list(xs), labels)
    bars.set_ylabel("generated tokens / s")
    bars.set_title(f"int8: loss {quant['val_loss']['change_pct']:+.2f}%, size x{quant['size_bytes']['ratio']:.2f}")
    bars.grid(alpha=0.3)
    bars.legend()
    return save_figure(fig, path)


def main(argv=None) -> dict:
    args = parse_args(argv)
    prune_path, quant_path, commands = produce_reports(args)
    result = gather(read_json(prune_path, "prune/iterative.py"), read_json(quant_path, "quantize/dynamic.py"))
    result.update({"sources": {"prune_report": str(prune_path), "quant_report": str(quant_path)},
                   "commands": commands, "environment": environment(choose_device("auto"))})
    result["plot"] = plot(result, args.results_dir / f"{NAME}.png")
    write_result(args.results_dir, NAME, result)
    return result


if __name__ == "__main__":
    main()
