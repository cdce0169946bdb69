"""Dynamic int8 quantization of a checkpoint, measured against the float model it came from.

    python quantize/dynamic.py                                  # the most-trained checkpoint under out/
    python quantize/dynamic.py --checkpoint out/train --out-dir out/int8 --dataset wikitext-103
    python quantize/dynamic.py --head fp16                      # keep the tied embedding / output head float

The linear layers of the transformer blocks get int8 weights (symmetric, per output channel) and
activations quantized per tensor at run time.  The tied embedding / output head is quantized too by
default (`--head int8`: one shared int8 matrix), as ONNX Runtime's GPT-2 converter and llama.cpp's Q8_0 do:
at batch 1 the head matmul is memory-bound and dominates once the blocks are int8, and int8 reads the fewest
bytes (`python -m bench.experiments generate_speed` times this default against both peers).  `--head fp16`
keeps it floating point and runs the head matmul from a half-precision copy (fbgemm's fp16 GEMM, x86 only);
`--head fp32` keeps it unchanged.  The report measures what the chosen head costs in validation loss.  The output folder is an ordinary artifact (config.json with "artifact": "int8" and
the list of quantized layers, model.safetensors with int8 weights and float32 scales) plus
quant_report.json; `sample.py --checkpoint OUT` and `serve/` load it.

Why PyTorch's own quantized engine (fbgemm/x86 `quantized::linear_dynamic`) and not torchao or a
hand-written `torch._int_mm` layer: on this project's 2-core CPU, for a GPT-2 MLP at 1 and 12 rows (decoding),
the engine was the only one of them well ahead of float at both (torchao 0.18's
Int8DynamicActivationInt8Weight, whose CPU path is not its focus, and torch._int_mm with per-row activation scales
were not ahead at one row; the weight-only `_weight_int8pack_mm` was slower than float).  The figures of the
engine against float and the peers are measured by this tool's report and bench/experiments/generate_speed.py.
The engine is marked deprecated in torch 2.13 but works in the pinned version.

Measurements run on CPU (that is where the int8 kernels are); on a CUDA machine the tool says so
and still measures on CPU.
"""
from __future__ import annotations

if __name__ == "__main__":  # first: a stop sent while the imports below take seconds is noted (runtime/stopping.py)
    from runtime.stopping import note_stops_while_starting
    note_stops_while_starting()

import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from data.corpus import dataset_help
from data.loader import eval_batches
from data.token_files import load_split
from model.int8 import HEAD_FORMATS, quantize_model
from model.packed_linear import pack_for_inference
from quantize.measure import (generation_speed, generation_warm_up, greedy_agreement, paired_validation,
                              prompts_from)
from runtime.cli import check_options, entry_point, non_default_flags, option, parse_config
from runtime.device import choose_device
from runtime.errors import UserError
from runtime.progress import Heartbeat, duration
from runtime.provenance import git_commit, provenance
from runtime.stopping import leaving
from runtime.timing import cpu_model, ratio_beside_floor
from storage.artifact import DEFAULT_OUT_ROOT, WEIGHTS_FILE, int8_artifact_writers, load_model, write_folder_atomically
from storage.claim import claim_output_folder
from storage.run_folder import evaluation_context, evaluation_dataset, pick_checkpoint

DEFAULT_OUT_DIR = str(DEFAULT_OUT_ROOT / "int8")
REPORT_FILE = "quant_report.json"
BATCH_SIZES = (1, 12)
DEFAULT_DATASET = "builtin"  # for a checkpoint that records no training dataset


class QuantizeError(UserError, ValueError):
    """Settings this tool cannot work with; the message names the flag."""


@dataclass
class QuantizeConfig:
    checkpoint: str | None = option(None, "float or pruned artifact folder, or hub name (default: the train.py "
                                          "checkpoint under out/ trained on the most tokens)")
    out_dir: str = option(DEFAULT_OUT_DIR, "folder for the int8 artifact and quant_report.json")
    overwrite: bool = option(False, "write into --out-dir even though it holds another tool's artifact (whose "
                                    "files are removed first)")
    dataset: str | None = option(None, f"validation text for the report: {dataset_help()} (default: the "
                                          f"checkpoint's training dataset, else {DEFAULT_DATASET})")
    head: str = option("int8", "format of the tied embedding / output head: int8 (head and embedding quantized "
                               "too, as ONNX Runtime's converter and llama.cpp's Q8_0 do: smallest and fastest), "
                               "fp16 (half-precision weight copy for the head matmul; floating point; x86 only), "
                               "fp32 (unchanged)", choices=HEAD_FORMATS)
    threads: int | None = option(None, "CPU threads for the measurements (default: torch's choice); both models "
                                       "get the same", min=1)
    eval_batches: int = option(16, "validation batches (the same leading windows)", min=1)
    eval_batch_size: int = option(4, "sequences per validation batch", min=1)
    eval_block_size: int | None = option(None, "validation window length (default: the block size the model "
                                               "was trained at, else its context)", min=1)
    prompt_tokens: int = option(32, "length of each generation prompt", min=1)
    new_tokens: int = option(32, "greedy tokens generated per prompt", min=1)
    repeats: int = option(5, "timed generation runs per model and batch size", min=1)

    def __post_init__(self):
        check_options(self, QuantizeError)


def json_writer(report: dict):
    return lambda path: path.write_text(json.dumps(report, indent=2) + "\n")


def weights_size(folder: Path) -> int:
    return (folder / WEIGHTS_FILE).stat().st_size


def print_table(report: dict) -> None:
    val, gen = report["validation"], report["generation"]
    rows = [("val loss", f"{val['float']['val_loss']:.4f}", f"{val['int8']['val_loss']:.4f}",
             f"{val['loss_increase_pct']:+.2f}%"),
            ("val perplexity", f"{val['float']['val_ppl']:.2f}", f"{val['int8']['val_ppl']:.2f}", "")]
    for b in BATCH_SIZES:
        row = gen[f"batch_{b}"]
        rows.append((f"tokens/s batch {b}", f"{row['float_tokens_per_s']:.1f}", f"{row['int8_tokens_per_s']:.1f}",
                     ratio_beside_floor(row["speedup"], row["noise_floor"])))
    size = report["size_bytes"]
    rows.append(("size on disk (MB)", f"{size['float'] / 1e6:.1f}", f"{size['int8'] / 1e6:.1f}",
                 f"{size['int8'] / size['float']:.2f}x"))
    print(f"validation on {report['dataset']}, {report['split']} split, windows of {report['eval_block_size']} "
          f"tokens")
    print(f"{'':20} {'float':>10} {'int8':>10}  change")
    for name, a, b, change in rows:
        print(f"{name:20} {a:>10} {b:>10}  {change}")
    greedy = report["greedy"]
    print(f"next-token agreement (teacher forced, {val['val_tokens']} tokens): {val['next_token_agreement']:.2%}")
    print(f"greedy continuations: {greedy['identical_tokens']:.2%} identical tokens, "
          f"{greedy['identical_rows']}/{greedy['rows']} rows identical")


def quantize(cfg: QuantizeConfig, beat: Heartbeat) -> dict:
    """Write the int8 artifact, then measure it against the float model; `beat` tells the user how it goes."""
    beat.phase("loading the model and quantizing it")
    source, why = pick_checkpoint(cfg.checkpoint)
    dataset, dataset_why = evaluation_dataset(cfg.dataset, source, DEFAULT_DATASET)
    print(f"model: {source} ({why}); dataset: {dataset} ({dataset_why})", file=sys.stderr)
    out_dir = Path(cfg.out_dir)
    float_model, source_meta = load_model(source, "cpu", kinds=("float", "pruned"),
                                          why="quantizing it again would only add error")
    claim_output_folder(out_dir, "quantize/dynamic.py", cfg.overwrite, source=source, out_flag="--out-dir")
    device = choose_device("auto")
    if device.type != "cpu":
        print(f"note: {device} found, but PyTorch's dynamic int8 kernels run on CPU only; quantizing and "
              f"measuring on CPU (on {device} the int8 artifact runs weight-only)", file=sys.stderr)
    print(f"quantizing {source_meta.kind} model from {source}", file=sys.stderr)
    context = float_model.config.block_size
    block, warning = evaluation_context(cfg.eval_block_size, "--eval-block-size", source, context)
    if block > context:
        raise QuantizeError(f"--eval-block-size {block} exceeds the model's context of {context}")
    if warning:
        print(warning, file=sys.stderr)
    if cfg.prompt_tokens + cfg.new_tokens > context:
        raise QuantizeError(f"--prompt-tokens + --new-tokens = {cfg.prompt_tokens + cfg.new_tokens} exceeds "
                         f"the model's context of {context}")
    tokens = load_split(dataset, "validation")  # before writing anything: a bad --dataset fails early
    int8_model, _ = load_model(source, "cpu")
    quantization = quantize_model(int8_model, head=cfg.head)
    writers = int8_artifact_writers(int8_model, provenance("quantize/dynamic.py", source), quantization)
    # The weights replace an earlier run's in this folder together with a report that says they are not
    # measured yet, so a run stopped while measuring never leaves the earlier run's report beside them.
    unmeasured = {"source": str(source), "artifact": str(out_dir), "measured": False,
                  "quantization": {"head": cfg.head, "layers": len(quantization["layers"]),
                                   "scheme": quantization["scheme"]},
                  "note": "quantize/dynamic.py stopped before measuring this artifact; run it again to measure"}
    write_folder_atomically(out_dir, {**writers, REPORT_FILE: json_writer(unmeasured)})
    with leaving(not_measured_yet(out_dir)):
        # Measure the artifact as every other tool will see it: reloaded from disk.
        int8_model, _ = load_model(out_dir, "cpu")
        print(f"wrote int8 artifact to {out_dir} ({len(quantization['layers'])} linear layers quantized, "
              f"{cfg.head} head); measuring", file=sys.stderr)

        # Each side on its fastest path: float linears packed for oneDNN (and an fp32 head of the int8 model).
        kernels = {"float": pack_for_inference(float_model), "int8": pack_for_inference(int8_model)}
        models = {"float": float_model, "int8": int8_model}
        prompts = prompts_from(tokens, max(BATCH_SIZES), cfg.prompt_tokens)
        beat.phase("generation warm-up: one greedy run per model and batch size")
        outputs, warm_up_s = generation_warm_up(models, prompts, BATCH_SIZES, cfg.new_tokens)
        generation_s = warm_up_s * 1.5 * cfg.repeats  # a timed repeat runs the float model twice (the noise floor)

        def estimate(first_batch_s: float) -> None:
            left = first_batch_s * (cfg.eval_batches - 1) + generation_s
            beat.expect(left, f"estimate: generation warm-up {duration(warm_up_s)}, first validation batch "
                              f"{duration(first_batch_s)}: about {duration(beat.elapsed() + left)} for the whole run, "
                              f"{duration(left)} to go")
        beat.phase(f"validation float vs int8 ({cfg.eval_batches} batches)")
        validation = paired_validation(float_model, int8_model,
                                       eval_batches(tokens, block, cfg.eval_batch_size, cfg.eval_batches),
                                       total_batches=cfg.eval_batches, on_first_batch=estimate)
        beat.phase(f"generation: {cfg.repeats} timed repeats of float, int8 and float again (the noise floor)")
        beat.expect(generation_s)
        generation = generation_speed(models, prompts, BATCH_SIZES, cfg.new_tokens, cfg.repeats)
        return {
            "source": str(source), "source_artifact": source_meta.kind, "artifact": str(out_dir),
            "quantization": {"head": cfg.head, "layers": len(quantization["layers"]),
                             "scheme": quantization["scheme"]},
            "dataset": dataset, "dataset_chosen": dataset_why, "split": "validation", "eval_block_size": block,
            "validation": validation, "generation": generation, "float_kernels": kernels,
            "greedy": greedy_agreement(outputs["float"], outputs["int8"], cfg.prompt_tokens),
            "measured": True,
            "size_bytes": {"float": weights_size(Path(source)), "int8": weights_size(out_dir)},
            "environment": {"device": "cpu", "threads": torch.get_num_threads(), "torch": torch.__version__,
                            "quantized_engine": torch.backends.quantized.engine, "machine": platform.machine(),
                            "cpu": cpu_model(), "git_commit": git_commit()},
            "command": " ".join(["python quantize/dynamic.py", *non_default_flags(cfg)]),
        }


def not_measured_yet(out_dir: Path) -> str:
    """What a stop while measuring leaves (the report of a run stopped earlier cannot be beside these weights)."""
    return (f"while measuring; the int8 artifact in {out_dir} is whole and its {REPORT_FILE} says it is not measured "
            f"yet (run again to measure)")


@entry_point(interrupted="before the int8 artifact was written; nothing was written")
def main(argv=None) -> None:
    cfg = parse_config(QuantizeConfig, __doc__, argv)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    with Heartbeat("quantize") as beat:
        report = quantize(cfg, beat)
    out_dir = Path(cfg.out_dir)
    with leaving(not_measured_yet(out_dir)):  # a save cut short is discarded
        write_folder_atomically(out_dir, {REPORT_FILE: json_writer(report)})
    with leaving(f"after writing {out_dir}: the int8 artifact and its measured {REPORT_FILE} are complete"):
        print_table(report)
    print(f"report: {out_dir / REPORT_FILE}", file=sys.stderr)


if __name__ == "__main__":
    main()
