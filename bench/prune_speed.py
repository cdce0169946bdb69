"""Measured speed of pruned GPT-2 against dense, on random weights (speed does not depend on training).

    python bench/prune_speed.py --threads 1          # gpt2 preset, row pruning to 50% widths, CSR at 50/80/90/95%
    python bench/prune_speed.py --preset tiny --repeats 3

Row pruning: forward tokens/s with logits at every position (as training and evaluation run it)
and with logits at the last position only (a generation prefill), and KV-cache generation tokens/s.
Unstructured: the same model magnitude-pruned to each sparsity with its block weights stored as
sparse CSR, against dense.  Every pruned model is timed interleaved with the dense one in this run;
figures are medians of the repeats.  Writes JSON to --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from pathlib import Path

import torch
from tqdm import tqdm

from model.config import PRESETS, preset
from model.gpt import GPT
from prune.csr import csr_copy
from prune.magnitude import magnitude_masks
from prune.masks import block_linear_weights
from prune.speed import SpeedSettings, forward_tokens_per_s, generation_tokens_per_s
from prune.structured import select_units, shrink
from runtime.device import choose_device
from runtime.provenance import git_commit


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--preset", default="gpt2", choices=tuple(PRESETS))
    parser.add_argument("--target", type=float, default=0.5, help="share of each layer's heads and MLP units removed")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--generation-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--csr-sparsities", default="0.5,0.8,0.9,0.95",
                        help="comma-separated unstructured sparsities to time in CSR format ('' to skip)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: torch's choice); 1 is steadier on a shared machine")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("out/bench/prune_speed.json"))
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = choose_device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dense = GPT(preset(args.preset)).to(device).eval()
    vocab = dense.config.vocab_size
    keep_hidden, keep_heads = select_units(dense, args.target, dense.config)
    row = shrink(dense, keep_hidden, keep_heads).eval()
    settings = SpeedSettings(args.batch_size, args.seq_len, args.generation_tokens, args.repeats)
    result = {"preset": args.preset, "device": str(device), "torch": torch.__version__, "git_commit": git_commit(),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "torch_threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
              "settings": dataclasses.asdict(settings),
              "parameters": {"dense": dense.num_parameters(), "row_pruned": row.num_parameters()}}
    models = {"dense": dense, "row": row}
    with tqdm(total=3, desc="row pruning speed") as bar:
        full = forward_tokens_per_s(models, settings, device, vocab)
        bar.update()
        last = forward_tokens_per_s(models, dataclasses.replace(settings, logits="last"), device, vocab)
        bar.update()
        gen = generation_tokens_per_s(models, settings, device, vocab)
        bar.update()
    result["row"] = {"target": args.target, "widths": {"mlp_hidden": row.config.mlp_hidden,
                                                       "n_head_per_layer": row.config.n_head_per_layer}}
    for name, speeds in (("forward_full_logits", full), ("forward_last_logits", last), ("generation", gen)):
        result["row"][name] = {"dense_tokens_per_s": speeds["dense"], "pruned_tokens_per_s": speeds["row"],
                               "speedup": speeds["row"] / speeds["dense"]}
    result["csr"] = []
    sparsities = [float(s) for s in args.csr_sparsities.split(",") if s.strip()]
    for sparsity in tqdm(sparsities, desc="CSR speed"):
        masked = GPT(dense.config).to(device).eval()
        masked.load_state_dict(dense.state_dict())
        magnitude_masks(block_linear_weights(masked), sparsity).apply()
        models = {"dense": dense, "csr": csr_copy(masked)}
        fwd = forward_tokens_per_s(models, settings, device, vocab)
        gen = generation_tokens_per_s(models, settings, device, vocab)
        result["csr"].append({"sparsity": sparsity, "forward_speedup": fwd["csr"] / fwd["dense"],
                              "generation_speedup": gen["csr"] / gen["dense"],
                              "dense_forward_tokens_per_s": fwd["dense"], "csr_forward_tokens_per_s": fwd["csr"],
                              "dense_generation_tokens_per_s": gen["dense"], "csr_generation_tokens_per_s": gen["csr"]})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{args.preset} on {device} ({torch.get_num_threads()} threads), batch {args.batch_size} x {args.seq_len}, "
          f"median of {args.repeats}; parameters {result['parameters']['dense']:,} -> "
          f"{result['parameters']['row_pruned']:,}")
    for name in ("forward_full_logits", "forward_last_logits", "generation"):
        r = result["row"][name]
        print(f"  row {args.target:.0%}  {name:20s} dense {r['dense_tokens_per_s']:10,.1f}  pruned "
              f"{r['pruned_tokens_per_s']:10,.1f} tokens/s  speedup {r['speedup']:.2f}x")
    for r in result["csr"]:
        print(f"  CSR {r['sparsity']:.0%}  forward {r['forward_speedup']:.2f}x  generation "
              f"{r['generation_speedup']:.2f}x dense")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
