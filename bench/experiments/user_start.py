"""The speed a user gets: processes started together as users start them, each decoding with generate()'s default,
set against the best fixed path (every step traced, on all threads), through a load that comes and goes.

    python -m bench.experiments user_start     # GPT-2 124M config, random weights, 4 processes, fp32 and int8,
                                               # batches 1, 4 and 12: quiet 20 s, one core busy 20 s, quiet 20 s

For each precision and batch, `--processes` fresh processes start at once (bench/workloads/user_decoder.py), half
of them on the default path (`load_model`, `pack_for_inference`, `generate()` as sample.py calls it) and half on the
fixed one; all of them make their first call (128 new tokens, the user's first call, with its trace and kernel
choices) at the same time, so their warm-ups overlap as six notebooks' or a server's beside a test run do.  Then
the processes are called one at a time, in turns whose order reverses every round, for three spans: quiet, one core
kept busy by another process (bench/workloads/busy_loop.py), quiet again.  Every call records when it ran, its
tokens/s and the 1-minute load average, so the figure shows tokens/s over time per path, and the recovery time is
how long after the load ended the default path's calls first come back within 5% of the fixed path's median over
the last span.  Ratios are the medians of paired calls (a default call against the fixed call next to it in the
same round), so a load that drifts weighs on both alike.  The host's read and matmul rates are measured before
each row; the rows run batch by batch, and each is also written to the work folder as it ends
(out/bench/user_start/rows_so_far.json).

ONNX Runtime is not a side here: its peer (bench/peers/setup.sh) pins onnxruntime 1.32, which this workplace's
package mirror does not hold offline, and bench/experiments/generate_speed.py times it where it is set up.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiment import ExperimentError, Experiment, RandomWeightsSettings
from bench.experiments.generate_speed import real_prompts
from bench.peers.colocated import busy_cores
from bench.peers.host_rates import HostRates, measure_in_process
from bench.plots import finish, plt
from bench.processes import PIPE, Process, start
from bench.record import write_result
from bench.report_page import Page, num
from model.config import preset
from model.gpt import GPT
from runtime.cli import non_default_flags, option
from runtime.provenance import provenance
from runtime.timing import Environment, environment
from storage.artifact import save_artifact

PATHS = ("default", "fixed")
LABELS = {"default": "default generate() (auto)", "fixed": "fixed: traced, all threads"}
SPANS = ("quiet before", "one core busy", "quiet after")
RECOVERED = 0.95  # of the fixed path's median after the load, the default path's call that counts as recovered


@dataclass
class Settings(RandomWeightsSettings):
    processes: int = option(4, "fresh processes started together per precision and batch (half default, half "
                               "fixed)", min=2)
    precisions: list[str] = option(["fp32", "int8"], "weights", choices=("fp32", "int8"))
    batch_sizes: list[int] = option([1, 4, 12], "rows per call", min=1)
    span_s: float = option(20.0, "seconds of each span: quiet, one core busy, quiet", min=1.0)
    first_tokens: int = option(128, "new tokens of each process's first call (the overlapped warm-up)", min=1)
    new_tokens: int = option(32, "new tokens per timed call", min=2)
    prompt_tokens: int = option(32, "prompt length", min=1)


@dataclass
class Call:
    path: str
    process: int
    start_s: float  # since the first span began
    end_s: float
    tokens_per_s: float  # new tokens (all rows) / the whole call
    span: str
    threads: int  # the thread count the call's steps ran with (the median over its steps)
    load_average_1m: float


@dataclass
class Row:
    precision: str
    batch: int
    warm_up_s: dict[str, list[float]]  # per path, each process's first call (overlapped with the others')
    tokens_per_s: dict[str, dict[str, float]]  # span -> path -> median
    default_over_fixed: dict[str, float]  # span -> median of paired ratios
    worst_round: dict[str, float]  # span -> the lowest paired ratio
    recovery_s: float | None  # after the load ended, until the default's calls were back; None: not within the span
    host_rates: HostRates
    load_average_1m: list[float]  # the first and last call's
    calls: list[Call]


@dataclass
class UserStart:
    model: str
    processes: int
    span_s: float
    new_tokens: int
    rows: list[Row]
    command: str
    environment: Environment


class Decoder:
    """One user_decoder process: started, then called one request at a time."""

    def __init__(self, artifact: Path, precision: str, path: str):
        self.path = path
        self.process: Process = start([sys.executable, "-m", "bench.workloads.user_decoder", str(artifact),
                                       precision, path], stdin=PIPE, stderr=None)

    def send(self, prompt: torch.Tensor, new_tokens: int) -> None:
        self.process.stdin.write(json.dumps({"prompt": prompt.tolist(), "new_tokens": new_tokens}) + "\n")
        self.process.stdin.flush()

    def answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise ExperimentError(f"a {self.path} decoder ended (exit code {self.process.wait()}); see its output "
                                  f"above")
        return json.loads(line)

    def call(self, prompt: torch.Tensor, new_tokens: int) -> dict:
        self.send(prompt, new_tokens)
        return self.answer()

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.stop(grace_s=10)


def load_average() -> float:
    return os.getloadavg()[0]


def run_row(artifact: Path, precision: str, batch: int, settings: Settings, rates: HostRates) -> Row:
    prompt = real_prompts(batch, settings.prompt_tokens)
    decoders = [Decoder(artifact, precision, PATHS[i % 2]) for i in range(settings.processes)]
    try:
        for decoder in decoders:
            decoder.answer()  # ready: the loading overlapped
        for decoder in decoders:  # the first calls, all at once
            decoder.send(prompt, settings.first_tokens)
        warm_up = {path: [] for path in PATHS}
        for decoder in decoders:
            warm_up[decoder.path].append(decoder.answer()["seconds"])
        calls = timeline(decoders, prompt, settings)
    finally:
        for decoder in decoders:
            decoder.stop()
    return summarize(precision, batch, warm_up, calls, settings, rates)


def timeline(decoders: list[Decoder], prompt: torch.Tensor, settings: Settings) -> list[Call]:
    """Calls in turns through the three spans; the busy loop runs through the second."""
    calls, origin, round_ = [], time.perf_counter(), 0
    new = settings.new_tokens * prompt.size(0)
    for index, span in enumerate(SPANS):
        end = (index + 1) * settings.span_s
        with busy_cores(1 if span == "one core busy" else 0):
            while time.perf_counter() - origin < end:
                order = range(len(decoders)) if round_ % 2 == 0 else reversed(range(len(decoders)))
                for i in order:
                    begun = time.perf_counter() - origin
                    answer = decoders[i].call(prompt, settings.new_tokens)
                    calls.append(Call(decoders[i].path, i, begun, time.perf_counter() - origin,
                                      new / answer["seconds"], span, answer["threads"], load_average()))
                round_ += 1
    return calls


def paired(calls: list[Call]) -> list[float]:
    """default / fixed tokens/s of each default call and the fixed call run next to it."""
    ratios = []
    for a, b in zip(calls, calls[1:]):
        if {a.path, b.path} == set(PATHS):
            default, fixed = (a, b) if a.path == "default" else (b, a)
            ratios.append(default.tokens_per_s / fixed.tokens_per_s)
    return ratios


def recovery(calls: list[Call], load_end_s: float) -> float | None:
    after = [c for c in calls if c.span == "quiet after"]
    fixed = [c.tokens_per_s for c in after if c.path == "fixed"]
    if not fixed:
        return None
    target = RECOVERED * statistics.median(fixed)
    defaults = [c for c in after if c.path == "default"]
    for i, call in enumerate(defaults):
        if all(c.tokens_per_s >= target for c in defaults[i:i + 2]):  # and the next one stays
            return max(0.0, call.end_s - load_end_s)
    return None


def summarize(precision: str, batch: int, warm_up: dict, calls: list[Call], settings: Settings,
              rates: HostRates) -> Row:
    speeds, ratios, worst = {}, {}, {}
    for span in SPANS:
        in_span = [c for c in calls if c.span == span]
        speeds[span] = {path: statistics.median([c.tokens_per_s for c in in_span if c.path == path])
                        for path in PATHS if any(c.path == path for c in in_span)}
        pairs = paired(in_span)
        ratios[span] = statistics.median(pairs) if pairs else float("nan")
        worst[span] = min(pairs) if pairs else float("nan")
    return Row(precision, batch, warm_up, speeds, ratios, worst, recovery(calls, 2 * settings.span_s), rates,
               [calls[0].load_average_1m, calls[-1].load_average_1m], calls)


def measure(settings: Settings, work_dir: Path) -> UserStart:
    torch.manual_seed(0)
    model = GPT(preset(settings.model)).eval()
    artifact = work_dir.resolve() / "model"
    save_artifact(artifact, model, model.config, "float", provenance("user_start"))
    del model
    rows = []
    command = " ".join(["python -m bench.experiments user_start", *non_default_flags(settings)])
    result = lambda: UserStart(settings.model, settings.processes, settings.span_s, settings.new_tokens, rows,
                               command, environment(torch.device("cpu")))
    # Batch by batch, both precisions at each: a run stopped part way (on a shared host a row can take many
    # minutes) has compared the paths at the smaller batches, whose rows it leaves in the work folder.
    for batch in settings.batch_sizes:
        for precision in settings.precisions:
            rates = measure_in_process(torch.get_num_threads())
            print(f"{precision} batch {batch}: {settings.processes} processes started together "
                  f"(load {load_average():.2f})", file=sys.stderr, flush=True)
            rows.append(run_row(artifact, precision, batch, settings, rates))
            row = rows[-1]
            print(f"  default/fixed {', '.join(f'{s} {row.default_over_fixed[s]:.2f}' for s in SPANS)}; "
                  f"recovered in {row.recovery_s} s", file=sys.stderr, flush=True)
            write_result(work_dir, "rows_so_far", result())
    return result()


def plot(result: UserStart):
    precisions = sorted({r.precision for r in result.rows}, key=["fp32", "int8"].index)
    batches = sorted({r.batch for r in result.rows})
    fig, axes = plt.subplots(len(precisions), len(batches), figsize=(4 * len(batches), 3 * len(precisions)),
                             squeeze=False)
    for row in result.rows:
        ax = axes[precisions.index(row.precision)][batches.index(row.batch)]
        busy = [c for c in row.calls if c.span == "one core busy"]
        if busy:  # where the busy calls ran (a round longer than a span shifts it, or leaves it without calls)
            ax.axvspan(busy[0].start_s, busy[-1].end_s, color="0.9", label="one core busy")
        for path, style in zip(PATHS, ("o-", "s--")):
            mine = [c for c in row.calls if c.path == path]
            ax.plot([(c.start_s + c.end_s) / 2 for c in mine], [c.tokens_per_s for c in mine], style, ms=3,
                    lw=0.8, label=LABELS[path])
        ax.set_title(f"{row.precision}, batch {row.batch}", fontsize=9)
        ax.set_xlabel("s")
        ax.set_ylabel("new tokens/s")
    return finish(fig, [ax for line in axes for ax in line],
                  f"{result.processes} processes warmed up together, then called in turns", legend=True)


def section(res: UserStart, page: Page) -> None:
    page.add(f"Timed paths: the user's default `generate()` (decode `auto`) and the best fixed path (`traced`, all "
             f"threads), each in {res.processes // 2} of {res.processes} fresh processes whose warm-ups overlapped "
             f"(all first calls at once); then {res.new_tokens} new tokens per call, one process at a time, through "
             f"{res.span_s:.0f} s quiet, {res.span_s:.0f} s with one core busy, {res.span_s:.0f} s quiet. "
             f"tokens/s are medians per span; default/fixed is the median (and lowest) of paired calls; recovery "
             f"is from the load's end until the default's calls are back within {1 - RECOVERED:.0%} of the fixed "
             f"path's.\n")
    header = ["precision", "batch", "path timed", "warm-ups"] + [f"{s} tokens/s" for s in SPANS] + [
        "default/fixed (lowest) per span", "recovery s", "host read GB/s, matmul GFLOP/s", "load 1m"]
    rows = []
    for r in res.rows:
        for path in PATHS:
            ratio = ", ".join(f"{r.default_over_fixed[s]:.2f} ({r.worst_round[s]:.2f})" for s in SPANS)
            rows.append([r.precision, r.batch, LABELS[path], f"overlapped ({res.processes})",
                         *[num(r.tokens_per_s[s].get(path)) for s in SPANS],
                         ratio if path == "default" else "", num(r.recovery_s) if path == "default" else "",
                         f"{r.host_rates.read_gb_per_s:.1f}, {r.host_rates.matmul_gflop_per_s:.0f}",
                         f"{r.load_average_1m[0]:.2f}-{r.load_average_1m[1]:.2f}"])
    page.table(header, rows)


EXPERIMENT = Experiment(
    name="user_start", title="Processes started as users start them: the default path through a passing load",
    about=__doc__, settings=Settings, quick=Settings(processes=2, batch_sizes=[1, 4], span_s=10.0),
    full=Settings(), result=UserStart, measure=measure, plot=plot, section=section)
