"""Dynamic int8 quantization of a checkpoint, measured against the float model it came from.

    python quantize/dynamic.py                                  # newest float/pruned artifact under out/
    python quantize/dynamic.py --checkpoint out/train --out-dir out/int8 --dataset wikitext-103
    python quantize/dynamic.py --head int8                      # the tied embedding / output head too

The linear layers of the transformer blocks get int8 weights (symmetric, per output channel) and
activations quantized per tensor at run time.  The tied embedding / output head stays floating
point by default: `--head auto` picks fp16 on x86 (the head matmul runs from a half-precision copy
through fbgemm's fp16 GEMM; at batch 1 that matmul is memory-bound and dominates once the blocks are
int8) and fp32 elsewhere; `--head fp32` keeps it unchanged, and `--head int8` quantizes it too.  The output folder is an ordinary artifact (config.json with "artifact": "int8" and
the list of quantized layers, model.safetensors with int8 weights and float32 scales) plus
quant_report.json; `sample.py --checkpoint OUT` and `serve/` load it.

Why PyTorch's own quantized engine (fbgemm/x86 `quantized::linear_dynamic`) and not torchao or a
hand-written `torch._int_mm` layer: on this project's 2-core CPU, for a 768->3072->768 MLP at 1 and
12 rows (decoding), the engine ran 2.8x and 7x faster than float, while torchao 0.18's
Int8DynamicActivationInt8Weight ran 0.8x and 2.8x (its CPU path is not its focus), torch._int_mm
with per-row activation scales 0.9x and 2.9x, and the weight-only `_weight_int8pack_mm` slower than
float.  The engine is marked deprecated in torch 2.13 but works in the pinned version.

Measurements run on CPU (that is where the int8 kernels are); on a CUDA machine the tool says so
and still measures on CPU.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from data.corpus import DATASET_NAMES, DatasetError
from data.loader import eval_batches
from data.shards import load_split
from data.tokenizer import TokenizerError
from model.artifact import (DEFAULT_OUT_ROOT, WEIGHTS_FILE, ArtifactError, artifact_writers, load_model, read_config,
                            write_folder_atomically)
from model.hub import resolve_checkpoint
from model.int8 import HEAD_FORMATS, default_head_format, int8_state_for_saving, quantize_model
from quantize.measure import generation_speed, greedy_agreement, paired_validation, prompts_from
from runtime.device import choose_device
from runtime.errors import UserError
from runtime.provenance import provenance
from training.checkpoint import default_checkpoint

DEFAULT_OUT_DIR = DEFAULT_OUT_ROOT / "int8"
REPORT_FILE = "quant_report.json"
BATCH_SIZES = (1, 12)



class QuantizeError(UserError, ValueError):
    """Settings this tool cannot work with; the message names the flag."""

def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--checkpoint", type=Path,
                        help="float or pruned artifact folder (default: the newest one under out/)")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR,
                        help="folder for the int8 artifact and quant_report.json")
    parser.add_argument("--dataset", default="builtin",
                        help=f"validation text for the report: {', '.join(DATASET_NAMES)}, or a local folder")
    parser.add_argument("--head", choices=("auto", *HEAD_FORMATS), default="auto",
                        help="format of the tied embedding / output head: auto (fp16 on x86, where fbgemm has an "
                             "fp16 GEMM, else fp32), fp32 (unchanged), fp16 (half-precision "
                             "weight copy for the head matmul; floating point, faster), int8 (head and embedding "
                             "quantized too: smallest and fastest, least accurate)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for the measurements (default: PyTorch's choice); both models get the same")
    parser.add_argument("--eval-batches", type=int, default=16, help="validation batches (the same leading windows)")
    parser.add_argument("--eval-batch-size", type=int, default=4)
    parser.add_argument("--eval-block-size", type=int, default=None,
                        help="validation window length (default: the model's context)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="length of each generation prompt")
    parser.add_argument("--new-tokens", type=int, default=32, help="greedy tokens generated per prompt")
    parser.add_argument("--repeats", type=int, default=5, help="timed generation runs per model and batch size")
    return parser.parse_args(argv)


def check(args) -> None:
    if args.threads is not None and args.threads < 1:
        raise QuantizeError(f"--threads must be at least 1, got {args.threads}")
    for name in ("eval_batches", "eval_batch_size", "prompt_tokens", "new_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise QuantizeError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.eval_block_size is not None and args.eval_block_size < 1:
        raise QuantizeError(f"--eval-block-size must be at least 1, got {args.eval_block_size}")


def refuse_int8_source(folder: Path) -> None:
    meta = read_config(folder)
    if meta.get("artifact") == "int8":
        source = (meta.get("produced_by") or {}).get("source")
        hint = f"quantize its float source instead: --checkpoint {source}" if source else \
            "quantize the float or pruned checkpoint it came from instead"
        raise ArtifactError(f"{folder} is already an int8 artifact; quantizing it again would only add "
                            f"error. {hint}")


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
                     f"{row['speedup']:.2f}x"))
    size = report["size_bytes"]
    rows.append(("size on disk (MB)", f"{size['float'] / 1e6:.1f}", f"{size['int8'] / 1e6:.1f}",
                 f"{size['int8'] / size['float']:.2f}x"))
    print(f"{'':20} {'float':>10} {'int8':>10} {'change':>9}")
    for name, a, b, change in rows:
        print(f"{name:20} {a:>10} {b:>10} {change:>9}")
    greedy = report["greedy"]
    print(f"next-token agreement (teacher forced, {val['val_tokens']} tokens): {val['next_token_agreement']:.2%}")
    print(f"greedy continuations: {greedy['identical_tokens']:.2%} identical tokens, "
          f"{greedy['identical_rows']}/{greedy['rows']} rows identical")


def quantize(args) -> dict:
    source, why = (resolve_checkpoint(args.checkpoint), "--checkpoint") if args.checkpoint else default_checkpoint()
    print(f"model: {source} ({why})", file=sys.stderr)
    if args.out_dir.resolve() == Path(source).resolve():
        raise QuantizeError(f"--out-dir {args.out_dir} is the source checkpoint; choose another folder")
    refuse_int8_source(source)
    device = choose_device("auto")
    if device.type != "cpu":
        print(f"note: {device} found, but PyTorch's dynamic int8 kernels run on CPU only; quantizing and "
              f"measuring on CPU (on {device} the int8 artifact runs weight-only)", file=sys.stderr)
    float_model, source_meta = load_model(source, "cpu")
    print(f"quantizing {source_meta['artifact']} model from {source}", file=sys.stderr)
    context = float_model.config.block_size
    block = args.eval_block_size or context
    if block > context:
        raise QuantizeError(f"--eval-block-size {block} exceeds the model's context of {context}")
    if args.prompt_tokens + args.new_tokens > context:
        raise QuantizeError(f"--prompt-tokens + --new-tokens = {args.prompt_tokens + args.new_tokens} exceeds "
                         f"the model's context of {context}")
    tokens = load_split(args.dataset, "validation")  # before writing anything: a bad --dataset fails early
    int8_model, _ = load_model(source, "cpu")
    if args.head == "auto":
        args.head = default_head_format()
        print(f"head format: {args.head} (auto; pass --head to choose)", file=sys.stderr)
    quantization = quantize_model(int8_model, head=args.head)
    writers = artifact_writers(int8_state_for_saving(int8_model), float_model.config, "int8",
                               provenance("quantize/dynamic.py", source), extra={"quantization": quantization})
    write_folder_atomically(args.out_dir, writers)
    # Measure the artifact as every other tool will see it: reloaded from disk.
    int8_model, _ = load_model(args.out_dir, "cpu")
    print(f"wrote int8 artifact to {args.out_dir} ({len(quantization['layers'])} linear layers quantized, "
          f"{args.head} head); measuring", file=sys.stderr)

    validation = paired_validation(float_model, int8_model,
                                   eval_batches(tokens, block, args.eval_batch_size, args.eval_batches),
                                   total_batches=args.eval_batches)
    prompts = prompts_from(tokens, max(BATCH_SIZES), args.prompt_tokens)
    generation, outputs = generation_speed({"float": float_model, "int8": int8_model}, prompts, BATCH_SIZES,
                                           args.new_tokens, args.repeats)
    return {
        "source": str(source), "source_artifact": source_meta["artifact"], "artifact": str(args.out_dir),
        "quantization": {"head": args.head, "layers": len(quantization["layers"]),
                         "scheme": quantization["scheme"]},
        "dataset": args.dataset, "split": "validation", "eval_block_size": block,
        "validation": validation, "generation": generation,
        "greedy": greedy_agreement(outputs["float"], outputs["int8"], args.prompt_tokens),
        "size_bytes": {"float": weights_size(Path(source)), "int8": weights_size(args.out_dir)},
        "environment": {"device": "cpu", "threads": torch.get_num_threads(), "torch": torch.__version__,
                        "quantized_engine": torch.backends.quantized.engine, "machine": platform.machine()},
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        check(args)
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        report = quantize(args)
    except UserError as e:
        sys.exit(f"error: {e}")
    write_folder_atomically(args.out_dir, {REPORT_FILE: lambda p: p.write_text(json.dumps(report, indent=2) + "\n")})
    print_table(report)
    print(f"report: {args.out_dir / REPORT_FILE}", file=sys.stderr)


if __name__ == "__main__":
    main()
