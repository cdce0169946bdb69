"""Measured (never projected) forward and generation throughput of several models, interleaved, and
what it says of a pruned model against the dense one (and of storing its zeros in sparse CSR format).

The models are timed in turns within each repeat (runtime/timing.py), so a change in machine load
hits all of them alike; each figure is the median over the repeats after one warm-up round.  Every round also
times a copy of the dense model, so each ratio has a noise floor measured beside it, under the same load; and a
ratio whose dense side moved more than that floor since the previous round is not read at all.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from decode.generate import generate
from model.gpt import GPT
from decode.sampling import SamplingParams
from prune.csr import csr_copy
from runtime.timing import noise_floor, ratio_beside_floor, time_interleaved

GENERATION_PROMPT_TOKENS = 16
KINDS = ("forward", "generation")  # the two rates each round measures, and so its two ratios
NOT_MEASURABLE = "not measurable on this host now"


@dataclass(frozen=True)
class SpeedSettings:
    batch_size: int = 4
    seq_len: int = 128
    generation_tokens: int = 32
    repeats: int = 5
    # "full": logits at every position, as training and evaluation compute them;
    # "last": logits at the last position only, as a generation prefill does.
    logits: str = "full"


@torch.inference_mode()
def forward_tokens_per_s(models: dict[str, torch.nn.Module], settings: SpeedSettings, device,
                         vocab_size: int) -> dict[str, float]:
    """Median tokens/s of one forward pass over a (batch, seq_len) block of random tokens."""
    generator = torch.Generator().manual_seed(0)
    idx = torch.randint(0, vocab_size, (settings.batch_size, settings.seq_len), generator=generator).to(device)
    last_only = settings.logits == "last"
    times = time_interleaved({name: lambda model=model: model(idx, last_only=last_only)
                              for name, model in models.items()}, settings.repeats, warmup=1, device=device)
    tokens = settings.batch_size * settings.seq_len
    return {name: tokens / statistics.median(t) for name, t in times.items()}


@torch.inference_mode()
def generation_tokens_per_s(models: dict[str, torch.nn.Module], settings: SpeedSettings, device,
                            vocab_size: int) -> dict[str, float]:
    """Median new tokens/s of greedy KV-cache generation from a short random prompt, batch 1, no early stop."""
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, vocab_size, (1, GENERATION_PROMPT_TOKENS), generator=generator).to(device)
    params = SamplingParams(max_new_tokens=settings.generation_tokens, temperature=0, stop_at_eot=False)
    times = time_interleaved({name: lambda model=model: generate(model, prompt, params)
                              for name, model in models.items()}, settings.repeats, warmup=1, device=device)
    return {name: settings.generation_tokens / statistics.median(t) for name, t in times.items()}


def measure(models: dict[str, torch.nn.Module], settings: SpeedSettings, device, vocab_size: int) -> dict[str, dict]:
    forward = forward_tokens_per_s(models, settings, device, vocab_size)
    generation = generation_tokens_per_s(models, settings, device, vocab_size)
    return {name: {"forward_tokens_per_s": forward[name], "generation_tokens_per_s": generation[name]}
            for name in models}


def speed_against_dense(dense: GPT, twin: GPT, model: GPT | None, settings: SpeedSettings, device,
                        with_csr: bool) -> dict:
    """Speed of `model` and of the dense model, interleaved in this round, beside this round's noise floor: `twin`
    (an identical copy of the dense model) is timed with them, and however far its ratio to the dense model strays
    from 1 is what chance alone produced under this round's load (runtime/timing.py's `noise_floor`).  A floor
    measured once, minutes earlier under another load, says nothing of this round's ratios.

    `model` None (round 0): the row's own speed is the twin's, so its ratios are the dense model against itself.
    With `with_csr`, also a copy of `model` whose block weights are stored in sparse CSR format (masked models)."""
    models = {"dense": dense, "twin": twin}
    if model is not None:
        models["pruned"] = model
    if with_csr and model is not None:
        models["csr"] = csr_copy(model)
    speed = measure(models, settings, device, dense.config.vocab_size)
    dense_speed, own = speed["dense"], speed["pruned" if model is not None else "twin"]
    itself = {kind: speed["twin"][f"{kind}_tokens_per_s"] / dense_speed[f"{kind}_tokens_per_s"] for kind in KINDS}
    row = {"forward_tokens_per_s": own["forward_tokens_per_s"],
           "generation_tokens_per_s": own["generation_tokens_per_s"],
           "dense_forward_tokens_per_s": dense_speed["forward_tokens_per_s"],
           "dense_generation_tokens_per_s": dense_speed["generation_tokens_per_s"],
           "dense_against_itself": itself, "noise_floor": noise_floor(*itself.values())}
    row["forward_speedup"] = row["forward_tokens_per_s"] / row["dense_forward_tokens_per_s"]
    row["generation_speedup"] = row["generation_tokens_per_s"] / row["dense_generation_tokens_per_s"]
    if "csr" in speed:
        csr = speed["csr"]
        row["csr"] = {**csr, "forward_speedup": csr["forward_tokens_per_s"] / dense_speed["forward_tokens_per_s"],
                      "generation_speedup": csr["generation_tokens_per_s"] / dense_speed["generation_tokens_per_s"]}
    return row


def dense_drift(previous: dict, row: dict) -> dict[str, float]:
    """How far the dense model's own rates moved from the previous round to this one (0.1: a tenth faster): the load
    changed under the run by that much, so a ratio taken now does not hold beyond this round."""
    return {kind: row[f"dense_{kind}_tokens_per_s"] / previous[f"dense_{kind}_tokens_per_s"] - 1 for kind in KINDS}


def judge_round(previous: dict, row: dict) -> None:
    """Records in `row` which of its ratios can be read: one whose dense side moved more than this round's floor
    since the previous round was taken on a host whose load is changing faster than the floor can speak for."""
    drift = dense_drift(previous, row)
    row["dense_moved_since_last_round"] = drift
    row["measurable"] = {kind: abs(drift[kind]) <= row["noise_floor"] for kind in KINDS}


def read_ratio(row: dict, kind: str, ratio: float | None = None) -> str:
    """`row`'s `kind` ratio (or `ratio`, another of its ratios of the same kind, such as CSR's) as a user should read
    it: beside the round's own floor, or `not measurable on this host now` with the reason."""
    ratio = row[f"{kind}_speedup"] if ratio is None else ratio
    if not row.get("measurable", {}).get(kind, True):
        moved = row["dense_moved_since_last_round"][kind]
        return (f"{NOT_MEASURABLE} (the dense model's own {kind} rate moved {moved:+.0%} since the last round, beyond "
                f"this round's +-{row['noise_floor']:.0%} noise floor)")
    return ratio_beside_floor(ratio, row["noise_floor"])


def sparse_format_verdict(rows: list[dict], device: torch.device) -> dict | None:
    """Whether storing the zeros in CSR made the final model faster than dense here (measured, not assumed).

    A speedup counts only beyond the final round's own noise floor, and only where that round's ratios are
    measurable (`judge_round`)."""
    last_row = rows[-1]
    last = last_row.get("csr")
    if last is None:
        return None
    noise = last_row["noise_floor"]
    forward, generation = last["forward_speedup"], last["generation_speedup"]
    measurable = all(last_row.get("measurable", {}).get(kind, True) for kind in KINDS)
    faster = measurable and (forward > 1 + noise or generation > 1 + noise)
    verdict = ("a real speedup" if faster else f"no real speedup (noise floor in this round: +-{noise:.0%})"
               if measurable else NOT_MEASURABLE)
    return {"format": "torch sparse CSR weights (torch.sparse.mm) in every block linear layer",
            "device": str(device), "forward_speedup": forward, "generation_speedup": generation,
            "noise_floor": noise, "measurable": measurable, "real_speedup": faster,
            "summary": f"CSR at {last_row['sparsity_pruned_tensors']:.1%} sparsity runs forward "
                       f"{read_ratio(last_row, 'forward', forward)} and generation "
                       f"{read_ratio(last_row, 'generation', generation)} against the dense model on {device.type}: "
                       f"{verdict}"}
