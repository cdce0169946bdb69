"""Write bench/REPORT.md from the results in bench/results: every table, every plot, the machine and the date.

    python bench/report.py                       # after bench/run_all.py (or any of the experiment scripts)
    python bench/report.py --results-dir DIR --out DIR/REPORT.md

Only what the results hold is written: an experiment that has not run gets a line saying so.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from bench.record import RESULTS_DIR, read_result

REPORT = RESULTS_DIR.parent / "REPORT.md"
MiB = 2**20


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--out", type=Path, default=REPORT)
    return parser.parse_args(argv)


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def num(value, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def spread(s: dict | None, digits: int = 1, scale: float = 1.0) -> str:
    if not s:
        return "n/a"
    return f"{s['median'] * scale:,.{digits}f} ({s['min'] * scale:,.{digits}f}-{s['max'] * scale:,.{digits}f})"


def mib(value) -> str:
    return "n/a" if value is None else f"{value / MiB:,.0f}"


class Report:
    def __init__(self, results_dir: Path, out: Path):
        self.results_dir, self.out = results_dir, out
        self.parts: list[str] = []
        self.loads: list[tuple[str, float, int]] = []

    def add(self, text: str) -> None:
        self.parts.append(text)

    def result(self, name: str) -> dict | None:
        found = read_result(self.results_dir, name)
        if found is None:
            self.add(f"*Not run: `{self.results_dir.name}/{name}.json` is missing.*\n")
        elif "environment" in found:
            env = found["environment"]
            self.loads.append((name, env.get("load_average_1m", 0.0), env.get("cpu_count") or 1))
        return found

    def image(self, result: dict) -> None:
        plot = result.get("plot")
        if plot:
            relative = os.path.relpath(self.results_dir / plot, self.out.parent)
            self.add(f"![{plot}]({relative})\n")


def scorecards(r: Report, run: dict | None) -> None:
    r.add("## Scorecard (`bench/leaderboard.py`)\n")
    names = sorted(p.stem for p in r.results_dir.glob("leaderboard*.json"))
    cards = [(n, read_result(r.results_dir, n)) for n in names]
    if not cards:
        r.add("*Not run: no `leaderboard*.json` in the results.*\n")
        return
    for _, card in cards:
        env = card["environment"]
        r.loads.append(("leaderboard", env.get("load_average_1m", 0.0), env.get("cpu_count") or 1))
    keys = ["loss", "inference_latency_1", "inference_latency_12", "training_throughput_4",
            "training_throughput_12", "time_to_first_token_s", "ms_per_token_batch_1"]
    header = ["figure", "unit", *[f"{c['artifact']['kind']} (`{Path(c['artifact']['path']).name}`)" for _, c in cards]]
    rows = []
    for key in keys:
        unit = cards[0][1]["units"].get(key, "")
        values = []
        for _, card in cards:
            s = card["spread"].get(key)
            digits = 4 if key == "loss" else 3 if key == "time_to_first_token_s" else 1
            values.append(num(card[key], digits) + (f" ({num(s['min'], digits)}-{num(s['max'], digits)})" if s else ""))
        rows.append([f"`{key}`", unit, *values])
    rows.append(["peak memory, inference", "MiB", *[mib(c["peak_memory_bytes"]["inference"]) for _, c in cards]])
    for b in (4, 12):
        rows.append([f"peak memory, training micro-batch {b}", "MiB",
                     *[mib(c["peak_memory_bytes"][f"training_{b}"]) for _, c in cards]])
    r.add(table(header, rows))
    first = cards[0][1]
    r.add("Medians of the timed repeats, (min-max) beside them. The five reference keys keep their names: "
          "`inference_latency_*` are throughputs in new tokens per second, as in the reference.\n")
    r.add("Definitions, from the scorecard itself:\n")
    for key in keys[:5] + ["peak_memory_bytes"]:
        r.add(f"- `{key}`: {first['definitions'][key]}")
    r.add("")
    note = first["generation"]["note"]
    layout = "one process" if first["training"]["parallel"] == "none" else \
        f"--parallel {first['training']['parallel']} on {first['training']['world_size']} ranks"
    r.add(f"Generation: {note}. Training figures: train.py as {layout}, tokens/s from its metrics.jsonl. "
          + ("The int8 scorecard's training figures are those of its float architecture (int8 is inference-only). "
             if any(c["training"]["architecture_only"] for _, c in cards) else ""))
    if run and run.get("leaderboard_text_note"):
        r.add(f"**Evaluation text:** {run['leaderboard_text_note']}\n")


def batch_sweep(r: Report) -> None:
    r.add("## 1. Batch-size sweep (`bench/batch_sweep.py`)\n")
    res = r.result("batch_sweep")
    if not res:
        return
    rows = [[x["batch_size"], spread(x["tokens_per_s"], 0), num(x["step_s"]["median"], 3),
             num(x["epoch_equivalent_s"], 0), mib(x["peak_memory_bytes"])] for x in res["rows"]]
    r.add(f"Model `{res['model']}`, block {res['block_size']}; an epoch-equivalent is the {res['train_tokens']:,} "
          f"tokens of the {res['dataset']} training split at the measured speed.\n")
    r.add(table(["micro-batch", "tokens/s (min-max)", "s/step", "s per epoch-equivalent", "peak memory MiB"], rows))
    limit = res["limit"]
    r.add(f"**Limit:** {'batch ' + str(limit['batch_size']) + ': ' if limit['batch_size'] else ''}{limit['reason']}."
          + (f" Memory cap: {res['memory_cap']}." if res.get("memory_cap") else "")
          + f" Peak memory: {res['peak_memory_meaning']}.\n")
    if res["rows"]:
        best = max(res["rows"], key=lambda x: x["tokens_per_s"]["median"])
        r.add(f"Fastest: micro-batch {best['batch_size']} at {best['tokens_per_s']['median']:,.0f} tokens/s "
              f"({best['tokens_per_s']['median'] / res['rows'][0]['tokens_per_s']['median']:.1f}x batch "
              f"{res['rows'][0]['batch_size']}).\n")
    r.image(res)


def data_loading(r: Report) -> None:
    r.add("## 2. Data loading (`bench/data_loading.py`)\n")
    res = r.result("data_loading")
    if not res:
        return
    rows = [[x["setting"], spread(x["first_batch_s"], 1, 1e3), spread(x["per_batch_s"], 3, 1e3),
             num(x["tokens_per_s"], 0)] for x in res["rows"]]
    r.add(f"Batches of {res['batch_size']} x {res['block_size']} tokens from the {res['dataset']} training split "
          f"({res['batches']} timed batches after the first, {res['repeats']} repeats).\n")
    r.add(table(["loader", "first batch ms", "ms per batch", "tokens/s delivered"], rows))
    base = res["rows"][0]
    loaders = res["rows"][1:]
    best = min(loaders, key=lambda x: x["per_batch_s"]["median"])
    r.add(f"The in-process sampler (what train.py uses) needs {base['per_batch_s']['median'] * 1e3:.3f} ms per "
          f"batch; the fastest DataLoader setting is `{best['setting']}` at {best['per_batch_s']['median'] * 1e3:.3f} "
          f"ms. Compare with the step times in experiment 3: slicing windows out of a memory-mapped file is "
          f"{'far below' if base['per_batch_s']['median'] < 0.01 else 'not negligible against'} one training step, "
          f"and worker processes add inter-process transfer and start-up.\n")
    r.image(res)


def phase_profile(r: Report) -> None:
    r.add("## 3. Phase profile (`bench/phase_profile.py`)\n")
    res = r.result("phase_profile")
    if not res:
        return
    r.add(f"`{res['model']}`, {res['steps']} steps of {res['batch_size']} x {res['block_size']}, validation on "
          f"{res['eval_batches']} batches every {res['eval_interval']} steps; {res['step_s'] * 1e3:.0f} ms per "
          f"training step.\n")
    r.add(table(["phase", "seconds", "share"], [[k, num(v, 3), f"{res['phase_share'][k]:.1%}"]
                                               for k, v in res["phase_s"].items()]))
    r.image(res)
    prof = res["profiler"]
    r.add(f"torch.profiler, {prof['steps']} steps: the trace is `bench/results/{prof['trace']}` (not committed; "
          f"open it in https://ui.perfetto.dev). Most expensive operators:\n")
    r.add(table(["operator", "calls", "self CPU ms", "self device ms"],
                [[f"`{o['op']}`", o["calls"], num(o["self_cpu_ms"]), num(o["self_device_ms"])] for o in prof["top_ops"]]))


def precision_memory(r: Report) -> None:
    r.add("## 4. Precision and memory (`bench/precision_memory.py`)\n")
    res = r.result("precision_memory")
    if not res:
        return
    rows = []
    for x in res["rows"]:
        if x.get("error"):
            rows.append([x["setting"], "failed", "", "", "", x["error"]])
            continue
        rows.append([x["setting"], num(x["step_s"], 3), num(x.get("time_vs_fp32"), 2), mib(x["peak_memory_bytes"]),
                     num(x.get("memory_vs_fp32"), 2), x["note"] or f"{x['steps_done']} steps, final loss "
                                                                f"{x['losses'][-1]:.3f}"])
    r.add(f"`{res['model']}`, batch {res['batch_size']} x block {res['block_size']}, {res['steps']} steps each, "
          f"one fresh train.py process per setting. Memory: {res['memory_meaning']}.\n")
    r.add(table(["setting", "s/step", "time vs fp32", "peak MiB", "memory vs fp32", "run"], rows))
    for x in res["rows"]:
        if x["precision"] == "fp32":
            continue
        if x.get("error"):
            r.add(f"- **{x['setting']}: unsupported here** ({x['error']})")
        elif not x.get("step_s"):
            r.add(f"- **{x['setting']}: too slow** -- {x['note']}")
        elif x.get("time_vs_fp32"):
            r.add(f"- **{x['setting']}: {x['time_vs_fp32']:.2f}x the fp32 step time "
                  f"({'slower' if x['time_vs_fp32'] > 1 else 'faster'}) on this {res['environment']['device_type']}**")
    if res.get("bf16_hardware"):
        r.add(f"- {res['bf16_hardware']}")
    r.add("")
    r.image(res)


def comm_strategies(r: Report) -> None:
    r.add("## 5. Communication strategies (`bench/comm_strategies.py`)\n")
    res = r.result("comm_strategies")
    if not res:
        return
    r.add(f"`{res['model']}`, global batch {res['global_batch']} x block {res['block_size']} at every world size, "
          f"torchrun with gloo, {res['threads_per_rank']} thread(s) per rank; medians of {res['timed_windows']} "
          f"windows of {res['steps_per_window']} steps after a warm-up window.\n")
    rows = []
    for x in res["rows"]:
        if "error" in x:
            rows.append([x["mode"], x["world_size"], "failed: " + x["error"][:80], "", "", "", "", "", ""])
            continue
        bw = x["bandwidth_bytes_per_s"]
        rows.append([x["mode"], x["world_size"], spread(x["iteration_s"], 0, 1e3), num(x["compute_s"]["median"] * 1e3, 0),
                     num(x["exposed_comm_s"]["median"] * 1e3, 0), num(x["sent_bytes_per_step"] / MiB, 2),
                     num(x["sent_bytes_theory_per_step"] / MiB, 2), num(bw["median"] / MiB, 0) if bw else "n/a",
                     " / ".join(mib(m) for m in x["peak_memory_bytes_per_rank"])])
    r.add(table(["mode", "ranks", "ms/iteration (min-max)", "compute ms", "exposed comm ms", "MiB sent/step",
                 "theory MiB", "bandwidth MiB/s", "peak MiB per rank"], rows))
    r.add("Strong scaling (same global batch): speedup = time per iteration on 1 rank / on N ranks.\n")
    worlds = sorted({s["world_size"] for s in res["strong_scaling"]})
    modes = list(dict.fromkeys(s["mode"] for s in res["strong_scaling"]))
    lookup = {(s["mode"], s["world_size"]): s for s in res["strong_scaling"]}
    r.add(table(["mode", *[f"{w} rank(s)" for w in worlds]],
                [[m, *[f"{lookup[(m, w)]['speedup']:.2f}x" if (m, w) in lookup else "n/a" for w in worlds]]
                 for m in modes]))
    cores = res["environment"].get("cpu_count")
    r.add(f"**Why these scaling figures are poor, and why they are not GPU figures.** This machine has {cores} "
          f"cores and every rank runs {res['threads_per_rank']} thread(s): at 2 ranks the job uses the cores one "
          f"rank alone left idle, at 4 ranks four processes share {cores} cores, so the compute cannot speed up "
          f"while every collective waits for whichever rank the scheduler has parked; that waiting is counted as "
          f"communication. Gloo over loopback copies through memory the ranks already compete for. On GPUs each "
          f"rank owns a device and NCCL uses NVLink or InfiniBand, so both the speedups and the bandwidths would "
          f"be of another order. The byte counts, in contrast, are properties of the strategies and hold anywhere: "
          f"measured and theoretical bytes per step are compared in the table.\n")
    r.image(res)


def tp_vs_fsdp(r: Report) -> None:
    r.add("## 6. Tensor parallel against FSDP (`bench/tp_vs_fsdp.py`)\n")
    res = r.result("tp_vs_fsdp")
    if not res:
        return
    r.add(f"`{res['model']}`, block {res['block_size']}, {res['world_size']} ranks, {res['threads_per_rank']} "
          f"thread(s) per rank. Memory: {res['memory_meaning']}.\n")
    rows = []
    for x in res["rows"]:
        if "error" in x:
            rows.append([x["global_batch"], x["mode"], "out of memory" if x["out_of_memory"] else "failed: "
                         + x["error"][:80], "", ""])
        else:
            rows.append([x["global_batch"], x["mode"], spread(x["tokens_per_s"], 0),
                         num(x["exposed_comm_s"]["median"] * 1e3, 0), mib(x["peak_memory_bytes_max_rank"])])
    r.add(table(["global batch", "mode", "tokens/s (min-max)", "exposed comm ms/step", "peak MiB (largest rank)"],
                rows))
    r.image(res)


def compression(r: Report) -> None:
    r.add("## 7. Compression (`bench/compression.py`, from `prune/` and `quantize/`)\n")
    res = r.result("compression")
    if not res:
        return
    for method, entry in res["pruning"].items():
        r.add(f"Pruning, `{method}`: {entry['finetune_steps']} fine-tuning steps after each round, validation on "
              f"{entry['eval']['batches']} batches of {entry['eval']['batch_size']} x {entry['eval']['block_size']} "
              f"({entry['dataset']}).\n")
        r.add(table(["sparsity", "val loss", "before fine-tune", "parameters stored", "non-zero", "forward speed",
                     "generation speed"],
                    [[f"{x['sparsity']:.0%}", num(x["val_loss"], 4), num(x["val_loss_after_pruning"], 4),
                      f"{x['parameters']:,}", f"{x['nonzero_parameters']:,}", f"{x['forward_speedup']:.2f}x",
                      f"{x['generation_speedup']:.2f}x"] for x in entry["rounds"]]))
        if entry.get("dense_control"):
            r.add(f"Dense control (same fine-tuning, no pruning): val loss {entry['dense_control']['val_loss']:.4f}.\n")
    q = res["quantization"]
    rows = [["val loss", num(q["val_loss"]["float"], 4), num(q["val_loss"]["int8"], 4), f"{q['val_loss']['change_pct']:+.2f}%"]]
    for key in sorted((k for k in q if k.startswith("tokens_per_s_")), key=lambda k: int(k.rsplit("_", 1)[1])):
        rows.append([key.replace("tokens_per_s_", "generated tokens/s, ").replace("_", " "), num(q[key]["float"]),
                     num(q[key]["int8"]), f"{q[key]['speedup']:.2f}x"])
    rows.append(["weights on disk (MB)", num(q["size_bytes"]["float"] / 1e6), num(q["size_bytes"]["int8"] / 1e6),
                 f"{q['size_bytes']['ratio']:.2f}x"])
    r.add(f"Dynamic int8 quantization ({res['quantization_dataset']} validation):\n")
    r.add(table(["", "float", "int8", "change"], rows))
    r.add(f"Teacher-forced next-token agreement {q['next_token_agreement']:.1%}; greedy continuations "
          f"{q['greedy_identical_tokens']:.1%} identical tokens.\n")
    r.image(res)


def header(r: Report, run: dict | None) -> None:
    env = None
    for name in ("leaderboard", "batch_sweep", "comm_strategies", "phase_profile"):
        found = read_result(r.results_dir, name)
        if found and "environment" in found:
            env = found["environment"]
            break
    r.add("# Benchmark report\n")
    r.add(f"Written by `bench/report.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
          + (f" from the results of `{run['command']}` ({run['total_s'] / 60:.1f} minutes, started "
             f"{run['started']})." if run else "."))
    if env:
        r.add(f"\n**Machine:** {env.get('cpu', env['device'])}, {env.get('cpu_count', '?')} logical cores, device "
              f"`{env['device_type']}`, torch {env['torch']}, Python {env['python']}, commit `{env['git_commit']}`.\n")
        if env["device_type"] == "cpu":
            r.add("**These are CPU figures, not GPU figures.** Every number below was measured on the CPU named "
                  "above, with models sized for it; on a GPU the absolute speeds, the ratios between settings "
                  "(mixed precision, data loading, communication) and the memory limits all differ. Run `make bench` "
                  "there to get its own report.\n")
    if run:
        r.add(f"Settings: {run['mode']}. {run.get('note', '')}\n")


def contention(r: Report) -> None:
    busy = [(name, load, cores) for name, load, cores in r.loads if load > cores + 0.5]
    r.add("## Conditions\n")
    if busy:
        r.add("**Other processes were running during part of this benchmark**: the 1-minute load average exceeded "
              "the core count when these results were written: "
              + ", ".join(f"{name} ({load:.1f} on {cores} cores)" for name, load, cores in busy)
              + ". Their speeds are lower and noisier than on an idle machine.\n")
    else:
        r.add("The 1-minute load average stayed at or below the core count when each result was written "
              "(no significant competing work).\n")


def write_report(results_dir: Path, out: Path) -> Path:
    r = Report(results_dir, out)
    run = read_result(results_dir, "run_all")
    header(r, run)
    scorecards(r, run)
    for section in (batch_sweep, data_loading, phase_profile, precision_memory, comm_strategies, tp_vs_fsdp,
                    compression):
        section(r)
    contention(r)
    if run:
        r.add("## Reproduce\n")
        r.add("```\n" + "\n".join(f"{stage['name']}: {stage['seconds']:.0f} s" for stage in run["stages"]) + "\n```\n")
        r.add(f"`{run['command']}` reruns everything; each script above also runs alone (`--help`).\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(r.parts) + "\n")
    print(f"wrote {out}")
    return out


def main(argv=None) -> Path:
    args = parse_args(argv)
    return write_report(args.results_dir, args.out)


if __name__ == "__main__":
    main()
