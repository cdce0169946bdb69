"""Write bench/REPORT.md from the results in bench/results, to read top-down: the headline (one row per question, the
newest result that answers it, and one plot: bench/headline.py), the scorecards, a section for every experiment in
the registry (its tables and its plot), the GPU section (bench/results/gpu/, from `make bench` on a CUDA machine),
the conditions, and last the dated appendix of figures measured by hand (bench/by_hand.md).

    python bench/report.py                       # after bench/run_all.py (or any single experiment)
    python bench/report.py --results-dir DIR --out DIR/REPORT.md

Only what the results hold is written: an experiment that has not run gets a line saying so.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.experiments import EXPERIMENTS
from bench.headline import headline_section
from bench.record import RESULTS_DIR, gpu_results, read_result
from bench.report_page import Page, mib, num
from bench.suite_report import suite_section
from runtime.cli import entry_point, option, parse_config
from runtime.provenance import git_commit

REPORT = RESULTS_DIR.parent / "REPORT.md"
# Figures measured by single commands outside `make bench` (fresh-clone timings, stop times, fuzz runs, ...), each
# with its command and result file: kept by hand, copied into the report as they are.
BY_HAND = RESULTS_DIR.parent / "by_hand.md"
APPENDIX = "by-hand"  # the anchor of the by-hand appendix
SCORECARD_KEYS = ("loss", "inference_latency_1", "inference_latency_12", "training_throughput_4",
                  "training_throughput_12", "time_to_first_token_s", "ms_per_token_batch_1")


@dataclass
class ReportConfig:
    results_dir: Path = option(RESULTS_DIR, "the results to report")
    out: Path = option(REPORT, "the Markdown file to write")


def title(page: Page) -> None:
    page.add("# Benchmark report\n")
    page.add(f"Written by `bench/report.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} at commit "
             f"`{git_commit()}`: first the headline, then the studies (the scorecard and one section per experiment), "
             f"the conditions, and the dated appendix of figures measured by hand.\n")


def header(page: Page, environments: list[tuple[str, dict]], run: dict | None) -> None:
    """What the studies below the headline were measured on, and by which run."""
    page.add("## The studies\n")
    if run:
        page.add(f"From the results of `{run['command']}` ({run['total_s'] / 60:.1f} minutes, started "
                 f"{run['started']}), except where a section says otherwise.")
    if environments:
        env = environments[0][1]
        page.add(f"\n**Machine:** {env.get('cpu', env['device'])}, {env.get('cpu_count', '?')} logical cores, device "
                 f"`{env['device_type']}`, torch {env['torch']}, Python {env['python']}, commit "
                 f"`{env['git_commit']}`.\n")
        if env["device_type"] == "cpu":
            page.add("**These are CPU figures, not GPU figures.** Every number above the GPU section was measured "
                     "on the CPU named above, with models sized for it; on a GPU the absolute speeds, the ratios "
                     "between settings (mixed precision, data loading, communication) and the memory limits all "
                     "differ. `make bench` on a CUDA machine writes the GPU section.\n")
    if run:
        page.add(f"Settings: {run['mode']}. {run.get('note', '')}\n")


def scorecards(page: Page, cards: list[dict], run: dict | None) -> None:
    page.add("## Scorecard (`bench/leaderboard.py`)\n")
    if not cards:
        page.add("*Not run: no `leaderboard*.json` in the results.*\n")
        return
    rows = []
    for key in SCORECARD_KEYS:
        digits = 4 if key == "loss" else 3 if key == "time_to_first_token_s" else 1
        values = []
        for card in cards:
            s = card["spread"].get(key)
            values.append(num(card[key], digits) + (f" ({num(s['min'], digits)}-{num(s['max'], digits)})" if s else ""))
        rows.append([f"`{key}`", cards[0]["units"].get(key, ""), *values])
    rows.append(["peak memory, inference", "MiB", *[mib(c["peak_memory_bytes"]["inference"]) for c in cards]])
    for b in (4, 12):
        rows.append([f"peak memory, training micro-batch {b}", "MiB",
                     *[mib(c["peak_memory_bytes"][f"training_{b}"]) for c in cards]])
    page.table(["figure", "unit", *[f"{c['artifact']['kind']} (`{Path(c['artifact']['path']).name}`)" for c in cards]],
               rows)
    first = cards[0]
    page.add("Medians of the timed repeats, (min-max) beside them. The five reference keys keep their names: "
             "`inference_latency_*` are throughputs in new tokens per second, as in the reference.\n")
    page.add("Definitions, from the scorecard itself:\n")
    for key in SCORECARD_KEYS[:5] + ("peak_memory_bytes",):
        page.add(f"- `{key}`: {first['definitions'][key]}")
    page.add("")
    training = first["training"]
    layout = "one process" if training["parallel"] == "none" else \
        f"--parallel {training['parallel']} on {training['world_size']} ranks"
    page.add(f"Generation: {first['generation']['note']}. Training figures: train.py as {layout}, tokens/s from its "
             f"metrics.jsonl. "
             + ("The int8 scorecard's training figures are those of its float architecture (int8 is "
                "inference-only). " if any(c["training"]["architecture_only"] for c in cards) else ""))
    if run and run.get("leaderboard_text_note"):
        page.add(f"**Evaluation text:** {run['leaderboard_text_note']}\n")


def anchor(name: str) -> str:
    """An HTML anchor before a heading: the headline links to it by a name that does not change with the heading's
    words or number (GitHub and the docs site both keep it)."""
    return f'<a id="{name}"></a>\n'


def experiment_section(page: Page, heading: str, experiment, result, results_dir: Path) -> None:
    """One experiment's heading, then its tables and plot, or a line saying its result is missing."""
    page.add(heading)
    if result is None:
        page.add(f"*Not run: `{results_dir.name}/{experiment.name}.json` is missing.*\n")
        return
    experiment.section(result, page)
    if experiment.figure(results_dir).exists():
        page.image(experiment.figure(results_dir))


def experiment_sections(page: Page, results_dir: Path, results: dict) -> None:
    for number, experiment in enumerate(EXPERIMENTS, 1):
        page.add(anchor(experiment.name))
        experiment_section(page, f"## {number}. {experiment.title} (`{experiment.source}`)\n", experiment,
                           results[experiment.name], results_dir)


def demo_section(page: Page, recorded: dict | None) -> None:
    """`make demo` and `make smoke`, stage by stage (bench/demo.py --record): what a new user waits for."""
    if not recorded:
        return
    page.add("## `make demo` and `make smoke`, stage by stage (`bench/demo.py`)\n")
    for sizes, run in recorded.items():
        rates = run["host_rates_at_the_end"]
        page.add(f"**make {sizes}**: {run['wall_s'] / 60:.1f} min in all on {run['host']}; at the end the host read "
                 f"{rates['read_gb_per_s']:.1f} GB/s and multiplied {rates['matmul_gflop_per_s']:.1f} GFLOP/s "
                 f"(load {rates['load_average_1m']:.1f}). `{run['command']}`, commit "
                 f"`{run['environment']['git_commit']}`, {run['environment']['date']}."
                 + (f" Note: {run['note']}." if run.get("note") else "") + "\n")
        page.table(["stage", "seconds"], [[name, f"{seconds:.0f}"] for name, seconds in run["stage_seconds"].items()])


def gpu_section(page: Page, gpu_dir: Path) -> None:
    """The GPU profile's results (bench/run_all.py on a CUDA machine), with the machine they came from."""
    page.add("## GPU\n")
    compared = [e for e in EXPERIMENTS if e.gpu is not None]
    results = {e.name: e.read(gpu_dir) for e in compared}
    measured = [r for r in results.values() if r is not None]
    if not measured:
        page.add(f"*Not measured: `{gpu_dir.parent.name}/{gpu_dir.name}/` holds no results. `make bench` on a CUDA "
                 f"machine (`python bench/run_all.py --nanogpt PATH`) measures "
                 f"{'; '.join(e.title for e in compared)} at GPU sizes and writes this section.*\n")
        return
    env = measured[0].environment
    run = read_result(gpu_dir, "run_all")
    page.add(f"**Machine:** {env.device}, torch {env.torch}, Python {env.python}, host CPU {env.cpu} "
             f"({env.cpu_count} logical cores), commit `{env.git_commit}`"
             + (f"; from `{run['command']}` ({run['total_s'] / 60:.1f} minutes, started {run['started']}).\n"
                if run else ".\n"))
    for experiment in compared:
        experiment_section(page, f"### {experiment.title} (`{experiment.source}`, GPU settings)\n", experiment,
                           results[experiment.name], gpu_dir)


def conditions(page: Page, environments: list[tuple[str, dict]]) -> None:
    page.add("## Conditions\n")
    busy = [(name, env) for name, env in environments if env["load_average_1m"] > (env["cpu_count"] or 1) + 0.5]
    if busy:
        page.add("**Other processes were running during part of this benchmark**: the 1-minute load average "
                 "exceeded the core count when these results were written: "
                 + ", ".join(f"{name} ({env['load_average_1m']:.1f} on {env['cpu_count']} cores)" for name, env in busy)
                 + ". Their speeds are lower and noisier than on an idle machine.\n")
    else:
        page.add("The 1-minute load average stayed at or below the core count when each result was written "
                 "(no significant competing work).\n")
    machines: dict[str, list[str]] = {}
    for name, env in environments:
        machines.setdefault(f"{env.get('cpu', env['device'])} ({env['device_type']})", []).append(name)
    if len(machines) > 1:
        page.add("**The results come from more than one machine**, so compare figures across sections with care: "
                 + "; ".join(f"{machine}: {', '.join(names)}" for machine, names in machines.items()) + ".\n")


def reproduce(page: Page, run: dict) -> None:
    page.add("## Reproduce\n")
    page.add("```\n" + "\n".join(f"{stage['name']}: {stage['seconds']:.0f} s" for stage in run["stages"]) + "\n```\n")
    page.add(f"`{run['command']}` reruns everything; each experiment also runs alone "
             f"(`python -m bench.experiments NAME --help`).\n")


def by_hand_appendix(text: str) -> tuple[str, list[tuple[str, str]]]:
    """bench/by_hand.md with an anchor before each of its sections, and each section's anchor with its text (for
    `section_link` to find the one that cites a result file)."""
    lines, sections = [], []
    for line in text.splitlines():
        if line.startswith("### "):
            sections.append((f"by-hand-{len(sections) + 1}", ""))
            lines.append(anchor(sections[-1][0]).rstrip("\n"))
        elif sections:
            sections[-1] = (sections[-1][0], sections[-1][1] + line + "\n")
        lines.append(line)
    return "\n".join(lines) + "\n", sections


def section_link(results_dir: Path, sections: list[tuple[str, str]]):
    """Where the report explains a result file: its experiment's section for the experiment's own result, else the
    by-hand section that names the file's folder (the newest such), else the appendix."""
    def link(path: Path) -> str:
        relative = path.relative_to(results_dir)
        if len(relative.parts) == 1 and relative.stem in {e.name for e in EXPERIMENTS}:
            number = next(i for i, e in enumerate(EXPERIMENTS, 1) if e.name == relative.stem)
            return f"[section {number}](#{relative.stem})"
        folder = relative.parent.as_posix() if len(relative.parts) > 1 else relative.as_posix()
        citing = [name for name, body in sections if folder in body]
        if citing:
            return f"[by hand: `{relative.as_posix()}`](#{citing[-1]})"
        return f"[appendix: `{relative.as_posix()}`](#{APPENDIX})"
    return link


def write_report(results_dir: Path, out: Path) -> Path:
    run = read_result(results_dir, "run_all")
    cards = {p.stem: read_result(results_dir, p.stem) for p in sorted(results_dir.glob("leaderboard*.json"))}
    results = {e.name: e.read(results_dir) for e in EXPERIMENTS}
    # Every result's machine record, the scorecards' first: the header names it, the conditions check load.
    environments = [(name, card["environment"]) for name, card in cards.items()]
    environments += [(name, asdict(result.environment)) for name, result in results.items() if result is not None]
    appendix, sections = by_hand_appendix(BY_HAND.read_text()) if BY_HAND.exists() else ("", [])
    page = Page(out)
    title(page)
    headline_section(page, results_dir, section_link(results_dir, sections))
    header(page, environments, run)
    scorecards(page, list(cards.values()), run)
    experiment_sections(page, results_dir, results)
    suite_section(page, results_dir)
    demo_section(page, read_result(results_dir, "demo_time"))
    gpu_section(page, gpu_results(results_dir))
    conditions(page, environments)
    if run:
        reproduce(page, run)
    page.add(anchor(APPENDIX))
    if appendix:
        page.add(appendix)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page.text())
    print(f"wrote {out}")
    return out


@entry_point
def main(argv=None) -> Path:
    cfg = parse_config(ReportConfig, __doc__, argv)
    return write_report(cfg.results_dir, cfg.out)


if __name__ == "__main__":
    main()
