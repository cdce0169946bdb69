"""The report's first screen: one row per question a reader asks first -- decoding against ONNX Runtime and
llama.cpp, serving against llama-server, training against nanoGPT, int8 quality, pruning -- each from the newest
result in bench/results that answers it (the experiments' own runs and the by-hand runs in its folders alike), on
the path users take, with the host's rates, the commit and a link to where the figures are explained; and one plot
of the ratios.

Newest is by the date each result records; a question none answers says so.  Only CPU results answer: the GPU
figures have their own section, on another machine.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.plots import finish, save_figure
from bench.report_page import Page

PLOT = "headline.png"
# A float model whose loss is within this of ln(vocabulary) is close to random weights: its int8 loss says nothing of
# quality (bench/by_hand.md, "int8 heads and int8 quality").
UNTRAINED_MARGIN = 1.0
GPT2_VOCAB = 50257


@dataclass
class Found:
    """One result file that answers a question: its path under the results folder and its parsed JSON."""
    path: Path
    data: dict

    @property
    def environment(self) -> dict:
        return self.data.get("environment") or {}


@dataclass
class Row:
    question: str
    path: str  # the command users run, and the settings measured
    ratio: str
    bars: dict[str, float]  # label -> ratio, for the plot
    rates: str
    measured: str  # the commit, the date, the machine
    link: str  # Markdown link to the section that explains it


def results_named(results_dir: Path, name: str, recursive: bool = True) -> list[Found]:
    """Every `name`.json (a glob) under `results_dir` (its own runs and, `recursive`, the by-hand runs' folders),
    parsed; unreadable ones are skipped (the report's sections name them)."""
    found = []
    for path in sorted((results_dir.rglob if recursive else results_dir.glob)(f"{name}.json")):
        try:
            found.append(Found(path, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue
    return found


def newest(candidates: list[Found], answers: Callable[[Found], bool]) -> Found | None:
    """The newest CPU result that answers the question (by its recorded date)."""
    fitting = [f for f in candidates if f.environment.get("device_type", "cpu") == "cpu" and answers(f)]
    return max(fitting, key=lambda f: f.environment.get("date", ""), default=None)


def measured_on(found: Found) -> str:
    env = found.environment
    commit = env.get("git_commit", "?")
    date = env.get("date", "")[:10] or "undated"
    cores = f" ({env['cpu_count']} cores)" if env.get("cpu_count") else ""
    return f"`{commit}`, {date}, {env.get('cpu', 'CPU not recorded')}{cores}"


def rates(read_gb_per_s: float | None, matmul_gflop_per_s: float | None, load: float | None) -> str:
    said = ([f"read {read_gb_per_s:.1f} GB/s, matmul {matmul_gflop_per_s:.0f} GFLOP/s"]
            if read_gb_per_s is not None and matmul_gflop_per_s is not None else ["rates not recorded"])
    if load is not None:
        said.append(f"load {load:.1f}")
    return "; ".join(said)


def ratio(value: float) -> str:
    return f"{value:.2f}x"


def comparisons(row: dict) -> dict[tuple[str, str], float]:
    return {(c["side"], c["against"]): c["end_to_end"] for c in row.get("comparisons", [])}


def quiet_batch_1(found: Found) -> dict | None:
    return next((row for row in found.data.get("results", []) if row.get("batch") == 1 and row.get("host") == "quiet"),
                None)


def decoding(results_dir: Path, link: Callable[[Path], str]) -> Row | str:
    def answers(found: Found) -> bool:
        row = quiet_batch_1(found)
        return row is not None and {("ours fp32", "ONNX Runtime fp32"), ("ours fp32", "llama.cpp F32")} <= \
            set(comparisons(row))
    found = newest(results_named(results_dir, "generate_speed"), answers)
    if found is None:
        return "no generate_speed result times ours against ONNX Runtime and llama.cpp at batch 1"
    row = quiet_batch_1(found)
    compared = comparisons(row)
    pairs = [("fp32", "ours fp32", "ONNX Runtime fp32", "ONNX Runtime"), ("fp32", "ours fp32", "llama.cpp F32",
                                                                            "llama.cpp"),
             ("int8", "ours int8", "ONNX Runtime int8", "ONNX Runtime"), ("int8", "ours int8", "llama.cpp Q8_0",
                                                                          "llama.cpp Q8_0")]
    bars = {f"decode {kind}: {peer}": compared[(ours, against)] for kind, ours, against, peer in pairs
            if (ours, against) in compared}
    said = "; ".join(f"{label.removeprefix('decode ')} {ratio(value)}" for label, value in bars.items())
    host = row.get("host_rates") or {}
    load = row.get("load_average") or [None]
    return Row("Decoding: new tokens/s against ONNX Runtime and llama.cpp",
               f"`sample.py` (decode {found.data.get('decode', '?')}), {found.data.get('model', '?')}, batch 1, "
               f"{found.data.get('prompt_tokens', '?')}-token prompt, {found.data.get('new_tokens', '?')} new tokens",
               said, bars, rates(host.get("read_gb_per_s"), host.get("matmul_gflop_per_s"), load[0]),
               measured_on(found), link(found.path))


def serving(results_dir: Path, link: Callable[[Path], str]) -> Row | str:
    def answers(found: Found) -> bool:
        peer = found.data.get("peer")
        return bool(peer and peer.get("levels")) and found.data.get("weights") == "fp32"
    found = newest(results_named(results_dir, "serve_speed"), answers)
    if found is None:
        return "no serve_speed result times our server against llama-server"
    peer = found.data["peer"]
    bars = {f"serve: {level['clients']} client{'s' if level['clients'] > 1 else ''}": level["ours_over_peer"]
            for level in peer["levels"]}
    said = "; ".join(f"{label.removeprefix('serve: ')} {ratio(value)}" for label, value in bars.items())
    return Row("Serving: streamed tokens/s against llama-server",
               f"`python -m serve` on the {found.data.get('weights')} artifact ({found.data.get('model', '?')}), "
               f"streaming clients, {peer.get('prompt_tokens', '?')}-token prompts, {found.data.get('new_tokens', '?')} "
               f"new tokens; {peer.get('peer', 'llama-server')}", said, bars,
               rates(None, None, found.environment.get("load_average_1m")), measured_on(found), link(found.path))


def training(results_dir: Path, link: Callable[[Path], str]) -> Row | str:
    def answers(found: Found) -> bool:
        return any(shape.get("ratio_ours_over_nanogpt") for shape in found.data.get("shapes", []))
    found = newest(results_named(results_dir, "train_speed"), answers)
    if found is None:
        return "no train_speed result times train.py's step against nanoGPT's"
    shapes = [s for s in found.data["shapes"] if s.get("ratio_ours_over_nanogpt")]
    bars = {f"train: {s['model']} {s['batch_size']}x{s['block_size']}": s["ratio_ours_over_nanogpt"] for s in shapes}
    said = "; ".join(f"{label.removeprefix('train: ')} {ratio(value)}" for label, value in bars.items())
    return Row("Training: step tokens/s against nanoGPT", f"`train.py`'s step, {found.data.get('precision', '?')}, "
               f"{'compiled' if found.data.get('compile') else 'eager'}, nanoGPT's own model.py and loop on the same "
               f"batches", said, bars, rates(None, None, found.environment.get("load_average_1m")),
               measured_on(found), link(found.path))


def trained(data: dict) -> bool:
    float_loss = ((data.get("validation") or {}).get("float") or {}).get("val_loss")
    return float_loss is not None and float_loss < math.log(GPT2_VOCAB) - UNTRAINED_MARGIN


def int8_quality(results_dir: Path, link: Callable[[Path], str]) -> Row | str:
    found = [f for f in results_named(results_dir, "quantize_*", recursive=False)
             if f.data.get("quantization", {}).get("head") == "int8" and trained(f.data)]
    if not found:
        return "no quant_report of a trained model with the int8 head"
    said, bars = [], {}
    for result in found:
        validation, dataset = result.data["validation"], Path(str(result.data.get("dataset"))).name
        said.append(f"{dataset}: loss {validation['loss_increase_pct']:+.2f}%, next token agrees "
                    f"{validation['next_token_agreement']:.1%}, batch 1 "
                    f"{ratio(result.data['generation']['batch_1']['speedup'])} float")
        bars[f"int8 over float, batch 1 ({dataset})"] = result.data["generation"]["batch_1"]["speedup"]
    first = found[0]
    return Row("int8 quality: validation loss and tokens against the float model",
               f"`quantize/dynamic.py --head int8` on `{first.data.get('source')}` (trained, float loss "
               f"{first.data['validation']['float']['val_loss']:.2f} on {first.data.get('dataset')})",
               "; ".join(said), bars, rates(None, None, None), measured_on(first), link(first.path))


def pruning(results_dir: Path, link: Callable[[Path], str]) -> Row | str:
    found = newest(results_named(results_dir, "prune_speed"), lambda f: bool(f.data.get("row")))
    if found is None:
        return "no prune_speed result"
    row = found.data["row"]
    bars = {"row-pruned: generation": row["generation"]["speedup"],
            "row-pruned: forward": row["forward_full_logits"]["speedup"]}
    params = found.data.get("parameters", {})
    return Row("Pruning: a row-pruned model against the dense one",
               f"`prune/iterative.py --method row --target {row.get('target')}` ({found.data.get('preset')}: "
               f"{params.get('dense', 0) / 1e6:.0f}M -> {params.get('row_pruned', 0) / 1e6:.0f}M parameters), timed "
               f"interleaved with the dense model",
               f"generation {ratio(row['generation']['speedup'])}, forward {ratio(row['forward_full_logits']['speedup'])}"
               f", prefill (last-position logits) {ratio(row['forward_last_logits']['speedup'])}", bars,
               rates(None, None, found.environment.get("load_average_1m")), measured_on(found), link(found.path))


QUESTIONS = (decoding, serving, training, int8_quality, pruning)


def plot(rows: list[Row], path: Path) -> None:
    labels = [label for row in rows for label in row.bars]
    values = [value for row in rows for value in row.bars.values()]
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(labels) + 1.4))
    ax.barh(range(len(labels)), values, color=["tab:green" if v >= 1 else "tab:red" for v in values])
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("ours / theirs, end to end (above 1: ours faster)")
    save_figure(finish(fig, [ax], "The headline ratios", grid="x"), path)


def headline_section(page: Page, results_dir: Path, link: Callable[[Path], str]) -> None:
    """The table, one row per question, and the plot of its ratios, drawn into `results/` beside the page (where
    the report's plots are: bench/results/ for bench/REPORT.md), never into a results folder it only reads.
    `link(path)`: the Markdown link to the section that explains a result file."""
    page.add("## Headline\n")
    answered, missing = [], []
    for question in QUESTIONS:
        row = question(results_dir, link)
        (answered if isinstance(row, Row) else missing).append(row)
    page.table(["question", "the path users take", "ours against it", "host's rates then", "measured at", "details"],
               [[r.question, r.path, r.ratio, r.rates, r.measured, r.link] for r in answered])
    if missing:
        page.add("Not answered by the results: " + "; ".join(missing) + ".\n")
    page.add("Each row is the newest CPU result in `bench/results` that answers its question (its date decides), "
             "end-to-end ratios, medians of per-round ratios; a ratio above 1 is ours faster. The rates are the "
             "host's read and matmul rates measured beside the figures, where the result records them, and the "
             "1-minute load average; the host was shared with other work, so read a ratio near 1 as a tie.\n")
    if answered:
        drawn = page.out.parent / "results" / PLOT
        plot(answered, drawn)
        page.image(drawn)
