"""The speed a user gets: processes started together as users start them, each on one of the user's paths, set
against the best fixed path (every step traced, on all threads) and ONNX Runtime, through a load that comes and goes.

    python -m bench.experiments user_start     # GPT-2 124M config, random weights, 6 processes, fp32 and int8,
                                               # batches 1, 4 and 12, quiet and on one core: quiet 20 s, one core
                                               # busy 20 s, quiet 20 s
    .peers/venv/bin/python -m bench.experiments user_start   # with ONNX Runtime (bench/peers/setup.sh)

The sides, each a fresh process:
- `default`: `load_model`, `pack_for_inference`, then `generate()` with its default decode, greedy
  (bench/workloads/user_decoder.py);
- `sample.py`: sample.py's own call with its defaults (temperature 0.8, top-k 200) on the prompt's text, its rows
  `--num-samples` copies of it (bench/workloads/sample_caller.py says why it is called in a process kept loaded);
- `server`: `python -m serve` with its defaults on the artifact (but a request's time limit of 600 s, not 120), and
  per call one streaming /v1/completions client (the rows as one request's prompts, greedy, exactly the tokens asked:
  bench/eval/loadtest.py's completion_body), timed from the request to the stream's `[DONE]`;
- `fixed`: the best fixed path, `generate(decode="traced")` on all the process's threads whatever the host does;
- `ORT`: ONNX Runtime on the same weights as its GPT-2 guide sets it up (bench/peers/onnx_peer.py, in a
  bench/peers/decode_sides.py process), measured only where onnxruntime, onnx and transformers import (the report
  says so where they do not).
Every side loads the same artifact folder: float, or int8 as quantize/dynamic.py writes it (the tied head in int8).

For each condition, precision and batch, `--processes` fresh processes start at once: one per side, the rest
alternately on the default and the fixed path.  All of them make their first call (128 new tokens: the user's first
call, with its trace and kernel choices; the server's start-up warm-up comes before, while the others load) at the
same time, so their warm-ups overlap as six notebooks' or a server's beside a test run do.  Then the processes are
called one at a time, in rounds (every process once) whose order reverses every round, through three spans: quiet,
one core kept busy by another process (bench/workloads/busy_loop.py), quiet again.  Every call records when it ran,
its new tokens per second over the whole call and the 1-minute load average, so the figure shows tokens/s over time
per side.  A span ends at its time, between two calls (a round cut short there goes on in the next span), so the
busy loop stops within one call of its 20 s.  Ratios are medians over the rounds of a span of each side's tokens/s
(the median of its processes in the round) over the fixed path's, or ONNX Runtime's, in the same round, so a load
that drifts weighs on both alike.  A side has recovered at the first call of each of its processes after the load
that comes back (and stays, its next call too) within 5% of the fixed path's median over the last span.  Recovery is
given two ways: in the side's own time (what its processes spent in their calls after the load, up to and including
that call: what a process that decodes without pause, a busy server, would wait), and on the wall clock from the
load's end (which adds the other processes' calls between its own, as they take turns).  `one-core` runs every
process (the busy loop too) on the first of this process's cores, as `taskset -c 0` would, each with one thread.
The host's read and matmul rates are measured before each row, under its condition; the rows run batch by batch,
and each is also written to the work folder as it ends (out/bench/user_start/rows_so_far.json).
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib.util
import json
import os
import statistics
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.eval.loadtest import completion_body, one_request
from bench.experiment import ExperimentError, Experiment, RandomWeightsSettings, SettingsError
from bench.experiments.generate_speed import real_prompts
from bench.experiments.serve_speed import save_served_artifact
from bench.peers.colocated import busy_cores
from bench.peers.decode_sides import SideError, Sides, SideSpec
from bench.peers.host_rates import HostRates, measure_in_process
from bench.plots import finish, plt
from bench.processes import PIPE, start
from bench.record import write_result
from bench.report_page import Page, num
from model.config import preset
from model.gpt import GPT
from runtime.cli import non_default_flags, option
from runtime.timing import Environment, environment
from serve.launch import ServerProcess

SIDES = ("default", "fixed", "sample.py", "server", "ORT")
LABELS = {"default": "load_model + pack_for_inference + default generate() (auto)",
          "fixed": "fixed: generate(decode=traced), all threads",
          "sample.py": "sample.py's call, its defaults (temperature 0.8, top-k 200)",
          "server": "python -m serve, its defaults (request time limit 600 s); one streaming /v1/completions "
                    "client",
          "ORT": "ONNX Runtime (its GPT-2 converter, optimizer, IO binding)"}
ADAPTIVE = ("default", "sample.py", "server")  # the sides whose choices follow the host, and so may need to recover
SPANS = ("quiet before", "one core busy", "quiet after")
CONDITIONS = ("quiet", "one-core")
RECOVERED = 0.95  # of the fixed path's median after the load, the call that counts as recovered
ORT_MODULES = ("onnxruntime", "onnx", "transformers")
SERVER_START_S = 600.0  # `python -m serve` loads and traces its steps while the other sides load, on a shared host
CALL_TIMEOUT_S = 600.0


@dataclass
class Settings(RandomWeightsSettings):
    sides: list[str] = option(list(SIDES), "the paths timed; the fixed path is the reference and always runs (ORT "
                                           "only where onnxruntime imports)", choices=SIDES)
    processes: int = option(7, "fresh processes started together per row: one per side, the rest alternately on "
                               "the default and the fixed path (7: two fixed ones, whose ratio is the rounds' noise "
                               "floor)", min=2)
    conditions: list[str] = option(list(CONDITIONS), "quiet: every core; one-core: every process on one core, one "
                                                     "thread each (as taskset -c 0)", choices=CONDITIONS)
    precisions: list[str] = option(["fp32", "int8"], "weights", choices=("fp32", "int8"))
    batch_sizes: list[int] = option([1, 4, 12], "rows per call", min=1)
    span_s: float = option(20.0, "seconds of each span: quiet, one core busy, quiet", min=1.0)
    first_tokens: int = option(128, "new tokens of each process's first call (the overlapped warm-up)", min=1)
    new_tokens: int = option(32, "new tokens per timed call", min=2)
    prompt_tokens: int = option(32, "prompt length", min=1)

    def __post_init__(self):
        super().__post_init__()
        if "fixed" not in self.sides:
            raise SettingsError("--sides must include fixed: every side is set against it")
        if self.processes < len(set(self.sides)):
            raise SettingsError(f"--processes {self.processes} cannot start one process for each of the "
                                f"{len(set(self.sides))} sides; give --processes {len(set(self.sides))} or more")


@dataclass
class Call:
    side: str
    process: int
    round: int
    start_s: float  # since the first span began
    end_s: float
    tokens_per_s: float  # new tokens (all rows) / the whole call
    span: str
    threads: int | None  # the thread count the call's steps ran with (its median over steps), where the side says
    load_average_1m: float


@dataclass
class Ratio:
    median: float
    lowest: float
    rounds: int


@dataclass
class Recovery:
    own_s: float  # the most any of the side's processes spent in its calls after the load until it was back
    wall_s: float  # from the load's end to the end of the last of those calls


@dataclass
class Row:
    condition: str
    precision: str
    batch: int
    processes: dict[str, int]  # side -> processes started for it (all at once)
    warm_up_s: dict[str, list[float]]  # side -> each process's first call (overlapped with the others')
    tokens_per_s: dict[str, dict[str, float]]  # span -> side -> median
    over_fixed: dict[str, dict[str, Ratio | None]]  # span -> side -> paired ratios; None: no round had both
    over_ort: dict[str, dict[str, Ratio | None]]
    # span -> the fixed path's first process over its second, per round: what chance alone moves a round's ratio
    # by (None without two fixed processes, or a round with both)
    twins: dict[str, Ratio | None]
    recovery: dict[str, Recovery | None]  # adaptive side -> how soon its calls were back after the load; None: never
    # when the busy loop started and stopped, seconds since the first span began (the same instant where the spans
    # before outlasted its time)
    load_s: list[float]
    host_rates: HostRates
    load_average_1m: list[float]  # the first and last call's
    calls: list[Call]


@dataclass
class UserStart:
    model: str
    processes: int
    span_s: float
    first_tokens: int
    new_tokens: int
    not_measured: dict[str, str]  # side -> why it was not measured
    rows: list[Row]
    command: str
    environment: Environment


@dataclass
class Answer:
    seconds: float
    new_tokens: int
    threads: int | None = None


class WorkloadSide:
    """A bench/workloads process (user_decoder, sample_caller) called one request at a time over JSON lines."""

    def __init__(self, side: str, command: list[str]):
        self.side = side
        self.process = start([sys.executable, "-m", *command], stdin=PIPE, stderr=None)

    def ready(self) -> None:
        self._line()

    def send(self, prompt: torch.Tensor, new_tokens: int) -> None:
        self.process.stdin.write(json.dumps({"prompt": prompt.tolist(), "new_tokens": new_tokens}) + "\n")
        self.process.stdin.flush()

    def answer(self) -> Answer:
        line = self._line()
        return Answer(line["seconds"], line["new_tokens"], line.get("threads"))

    def _line(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise ExperimentError(f"a {self.side} process ended (exit code {self.process.wait()}); see its output "
                                  f"above")
        return json.loads(line)

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.stop(grace_s=10)


class ServerSide:
    """`python -m serve` with its defaults, and one streaming /v1/completions client per call (from a thread, so that
    the first call runs while the other sides make theirs)."""

    def __init__(self, artifact: Path, log: Path, rows: int):
        self.side, self.log, self.model = "server", log, artifact.name
        # Its defaults but the time limit on a request (120 s), which a host as loaded as a shared one can pass while
        # every side warms up at once: the call would then fail rather than be timed; and the completions one request
        # may ask for (8), under the row count of batch 12.
        self.server = ServerProcess(artifact, log, ["--request-timeout-s", str(int(CALL_TIMEOUT_S)),
                                                    "--max-completions", str(max(rows, 8))])
        self.client = ThreadPoolExecutor(max_workers=1)
        self.pending: Future | None = None

    def ready(self) -> None:
        try:
            self.server.wait_until_healthy(SERVER_START_S)
        except RuntimeError as e:
            raise ExperimentError(f"the server did not start: {str(e).splitlines()[0]} (its log: {self.log})") from e

    def send(self, prompt: torch.Tensor, new_tokens: int) -> None:
        body = completion_body(self.model, prompt.tolist(), new_tokens)
        self.pending = self.client.submit(
            lambda: asyncio.run(one_request(self.server.url, body, CALL_TIMEOUT_S, "/v1/completions")))

    def answer(self) -> Answer:
        outcome = self.pending.result()
        if outcome.error is not None or outcome.status != 200:
            raise ExperimentError(f"a streaming /v1/completions call failed (status {outcome.status}): "
                                  f"{outcome.error} (the server's log: {self.log})")
        return Answer(outcome.latency_s, outcome.tokens)

    def stop(self) -> None:
        self.client.shutdown()
        self.server.stop()


class OrtSide:
    """One ONNX Runtime process of a group started together (bench/peers/decode_sides.py)."""

    def __init__(self, sides: Sides, name: str, rows: int):
        self.side, self.sides, self.name, self.rows = "ORT", sides, name, rows
        self.asked = 0

    def ready(self) -> None:  # the group waited for every process's answer as it started them
        pass

    def send(self, prompt: torch.Tensor, new_tokens: int) -> None:
        self.asked = new_tokens
        self.sides.send(self.name, prompt, new_tokens)

    def answer(self) -> Answer:
        seconds, _ = self.sides.receive(self.name)
        return Answer(seconds, self.asked * self.rows)

    def stop(self) -> None:  # the group is stopped as a whole
        pass


def ort_missing() -> str | None:
    """Why ONNX Runtime cannot be a side in this Python; None when it can."""
    missing = [m for m in ORT_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (f"{', '.join(missing)} not importable in {sys.executable}: bench/peers/setup.sh installs them in "
            f".peers/venv; run this experiment with .peers/venv/bin/python")


def assigned(sides: list[str], processes: int) -> list[str]:
    """The side of each process: one per side, the rest alternately default and fixed (fixed alone without it)."""
    extra = [s for s in ("default", "fixed") if s in sides]
    return list(sides) + [extra[i % len(extra)] for i in range(processes - len(sides))]


@contextlib.contextmanager
def pinned(condition: str):
    """`one-core`: this process, and so every process it starts in the block, on its first core only."""
    if condition != "one-core":
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def started(plan: list[str], artifact: Path, graph: Path | None, rows: int, log_dir: Path) -> list:
    """Every process of a row, loading at once: the workload processes and the server first (they do not wait), then
    the ONNX Runtime group, which waits for its processes while the others load; the group comes last in the list."""
    processes = []
    for i, side in enumerate(plan):
        if side in ("default", "fixed"):
            processes.append(WorkloadSide(side, ["bench.workloads.user_decoder", str(artifact), side]))
        elif side == "sample.py":
            processes.append(WorkloadSide(side, ["bench.workloads.sample_caller", str(artifact)]))
        elif side == "server":
            processes.append(ServerSide(artifact, log_dir / f"server_{i}.log", rows))
    ort = [i for i, side in enumerate(plan) if side == "ORT"]
    if ort:
        threads = len(os.sched_getaffinity(0))
        try:
            group = Sides([SideSpec(f"ORT {i}", "onnxruntime", (str(graph),), threads) for i in ort])
        except SideError as e:
            stopped(processes)
            raise ExperimentError(str(e)) from e
        for i in ort:
            processes.insert(i, OrtSide(group, f"ORT {i}", rows))
        processes.append(group)
    return processes


def stopped(processes: list) -> None:
    for process in processes:
        if isinstance(process, Sides):
            process.__exit__()
        else:
            process.stop()


def run_row(condition: str, precision: str, batch: int, plan: list[str], artifact: Path, graph: Path | None,
            settings: Settings, rates: HostRates, work_dir: Path) -> Row:
    prompt = real_prompts(batch, settings.prompt_tokens)
    everything = started(plan, artifact, graph, batch, work_dir)
    processes = everything[:len(plan)]
    try:
        for process in processes:
            process.ready()  # the loading overlapped
        for process in processes:  # the first calls, all at once
            process.send(prompt, settings.first_tokens)
        warm_up = {side: [] for side in dict.fromkeys(plan)}
        for process in processes:
            warm_up[process.side].append(process.answer().seconds)
        calls, load = timeline(processes, prompt, settings)
    finally:
        stopped(everything)
    return summarize(condition, precision, batch, plan, warm_up, calls, load, rates)


def timeline(processes: list, prompt: torch.Tensor, settings: Settings) -> tuple[list[Call], list[float]]:
    """Calls in rounds through the three spans, and when the busy loop, which runs through the second, started and
    stopped.  A span ends between two calls once its time is up; the round it cut short goes on in the next span."""
    calls, origin, round_, load = [], time.perf_counter(), 0, []
    pending: list[int] = []  # the processes the round still has to call
    for index, span in enumerate(SPANS):
        end = (index + 1) * settings.span_s
        busy = span == "one core busy"
        with busy_cores(1 if busy else 0):
            if busy:
                load.append(time.perf_counter() - origin)
            while time.perf_counter() - origin < end:
                if not pending:
                    pending = list(range(len(processes)) if round_ % 2 == 0 else reversed(range(len(processes))))
                i = pending.pop(0)
                begun = time.perf_counter() - origin
                processes[i].send(prompt, settings.new_tokens)
                answer = processes[i].answer()
                calls.append(Call(processes[i].side, i, round_, begun, time.perf_counter() - origin,
                                  answer.new_tokens / answer.seconds, span, answer.threads, os.getloadavg()[0]))
                if not pending:
                    round_ += 1
        if busy:
            load.append(time.perf_counter() - origin)
    return calls, load


def paired(calls: list[Call], side: str, against: str) -> list[float]:
    """Per round that has both: `side`'s tokens/s over `against`'s (each the median of its processes' calls)."""
    def by_round(name):
        rounds: dict[int, list[float]] = {}
        for c in calls:
            if c.side == name:
                rounds.setdefault(c.round, []).append(c.tokens_per_s)
        return {r: statistics.median(v) for r, v in rounds.items()}
    mine, theirs = by_round(side), by_round(against)
    return [mine[r] / theirs[r] for r in sorted(mine) if r in theirs]


def twins(calls: list[Call]) -> Ratio | None:
    """Per round that has both: the fixed path's first process's tokens/s over its second's."""
    processes = sorted({c.process for c in calls if c.side == "fixed"})[:2]
    if len(processes) < 2:
        return None
    rounds = [{c.round: c.tokens_per_s for c in calls if c.process == p} for p in processes]
    pairs = [rounds[0][r] / rounds[1][r] for r in sorted(rounds[0]) if r in rounds[1]]
    return Ratio(statistics.median(pairs), min(min(pairs), 1 / max(pairs)), len(pairs)) if pairs else None


def ratio(calls: list[Call], side: str, against: str) -> Ratio | None:
    pairs = paired(calls, side, against)
    return Ratio(statistics.median(pairs), min(pairs), len(pairs)) if pairs else None


def recovery(calls: list[Call], side: str, load_end_s: float) -> Recovery | None:
    """How soon after the load `side` was back: every one of its processes has a call after the load within 5% of
    the fixed path's median there, and its next call too (or it has no next call); None where one never had."""
    after = [c for c in calls if c.span == "quiet after" and c.start_s >= load_end_s]
    fixed = [c.tokens_per_s for c in after if c.side == "fixed"]
    processes = sorted({c.process for c in after if c.side == side})
    if not fixed or not processes:
        return None
    target = RECOVERED * statistics.median(fixed)
    own, wall = 0.0, 0.0
    for process in processes:
        mine = [c for c in after if c.process == process]
        back = next((i for i in range(len(mine)) if all(c.tokens_per_s >= target for c in mine[i:i + 2])), None)
        if back is None:
            return None
        own = max(own, sum(c.end_s - c.start_s for c in mine[:back + 1]))
        wall = max(wall, mine[back].end_s - load_end_s)
    return Recovery(own, wall)


def summarize(condition: str, precision: str, batch: int, plan: list[str], warm_up: dict, calls: list[Call],
              load: list[float], rates: HostRates) -> Row:
    """`load`: when the busy loop started and stopped."""
    sides = list(dict.fromkeys(plan))
    speeds, over_fixed, over_ort, floor = {}, {}, {}, {}
    for span in SPANS:
        in_span = [c for c in calls if c.span == span]
        speeds[span] = {side: statistics.median([c.tokens_per_s for c in in_span if c.side == side])
                        for side in sides if any(c.side == side for c in in_span)}
        over_fixed[span] = {side: ratio(in_span, side, "fixed") for side in sides if side != "fixed"}
        over_ort[span] = {side: ratio(in_span, side, "ORT") for side in sides if side != "ORT"}
        floor[span] = twins(in_span)
    recovered = {side: recovery(calls, side, load[-1]) for side in sides if side in ADAPTIVE}
    return Row(condition, precision, batch, {side: plan.count(side) for side in sides}, warm_up, speeds, over_fixed,
               over_ort, floor, recovered, load, rates,
               [calls[0].load_average_1m, calls[-1].load_average_1m] if calls else [], calls)


def measure(settings: Settings, work_dir: Path) -> UserStart:
    torch.manual_seed(0)
    model = GPT(preset(settings.model)).eval()
    work_dir = work_dir.resolve()
    artifacts = {}
    for precision in settings.precisions:
        artifacts[precision] = work_dir / f"model_{precision}"
        # int8 from a copy: quantizing is in place, and ONNX Runtime's converter below takes the float model
        save_served_artifact(artifacts[precision], copy.deepcopy(model), precision)
    sides, not_measured, graphs = list(dict.fromkeys(settings.sides)), {}, {}
    if "ORT" in sides:
        why = ort_missing()
        if why is None:
            print("converting the model with ONNX Runtime's GPT-2 converter and optimizer", file=sys.stderr,
                  flush=True)
            from bench.peers.onnx_peer import ort_files
            graphs = ort_files(model, work_dir / "onnx")
        else:
            print(f"ORT is not measured: {why}", file=sys.stderr, flush=True)
            not_measured["ORT"] = why
            sides.remove("ORT")
    del model
    plan = assigned(sides, settings.processes)
    rows = []
    command = " ".join(["python -m bench.experiments user_start", *non_default_flags(settings)])
    result = lambda: UserStart(settings.model, settings.processes, settings.span_s, settings.first_tokens,
                               settings.new_tokens, not_measured, rows, command, environment(torch.device("cpu")))
    # Batch by batch, every condition and precision at each: a run stopped part way (on a shared host a row can take
    # many minutes) has compared the paths at the smaller batches, whose rows it leaves in the work folder.
    for batch in settings.batch_sizes:
        for condition in settings.conditions:
            for precision in settings.precisions:
                with pinned(condition):
                    cores = sorted(os.sched_getaffinity(0))
                    rates = measure_in_process(len(cores), cores)
                    print(f"{condition}, {precision} batch {batch}: {len(plan)} processes started together "
                          f"({', '.join(f'{plan.count(s)} {s}' for s in sides)}; load {os.getloadavg()[0]:.2f})",
                          file=sys.stderr, flush=True)
                    rows.append(run_row(condition, precision, batch, plan, artifacts[precision],
                                        graphs.get(precision), settings, rates, work_dir))
                row = rows[-1]
                print("  over fixed (its twin first), " + "; ".join(
                    f"{s}: " + ", ".join(shown(row.twins[span] if s == "fixed" else row.over_fixed[span].get(s))
                                         for span in SPANS) for s in sides)
                      + "; recovered in " + ", ".join(f"{s} {recovery_cell(row, s)}" for s in row.recovery),
                      file=sys.stderr, flush=True)
                write_result(work_dir, "rows_so_far", result())
    return result()


def shown(r: Ratio | None) -> str:
    return "-" if r is None else f"{r.median:.2f}"


def plot(result: UserStart):
    panels = sorted({(r.condition, r.precision) for r in result.rows},
                    key=lambda p: (CONDITIONS.index(p[0]), ["fp32", "int8"].index(p[1])))
    batches = sorted({r.batch for r in result.rows})
    fig, axes = plt.subplots(len(panels), len(batches), figsize=(4 * len(batches), 3 * len(panels)), squeeze=False)
    styles = {"default": "o-", "fixed": "s--", "sample.py": "^:", "server": "v:", "ORT": "d-."}
    for row in result.rows:
        ax = axes[panels.index((row.condition, row.precision))][batches.index(row.batch)]
        ax.axvspan(*row.load_s, color="0.9", label="one core busy")
        for side in row.processes:
            mine = [c for c in row.calls if c.side == side]
            ax.plot([(c.start_s + c.end_s) / 2 for c in mine], [c.tokens_per_s for c in mine], styles[side], ms=3,
                    lw=1.2 if side in ("default", "fixed") else 0.6, label=side)
        ax.set_title(f"{row.condition}, {row.precision}, batch {row.batch}", fontsize=9)
        ax.set_xlabel("s")
        ax.set_ylabel("new tokens/s")
    return finish(fig, [ax for line in axes for ax in line],
                  f"{result.processes} processes warmed up together, then called in turns", legend=True)


def unpaired(row: Row, span: str, against: str, not_measured: dict[str, str]) -> str:
    """Why a side has no ratio against `against` in `span`."""
    if against not in row.processes:
        return f"no {against} side" + (" (see above)" if against in not_measured else "")
    if not any(c.span == span for c in row.calls):
        return "no round"
    return "no round with both"


def ratios_cell(row: Row, side: str, against: str, table: dict, not_measured: dict[str, str]) -> str:
    if side == against == "fixed" and any(row.twins.values()):
        return "reference; its first process over its second: " + " / ".join(
            "no round with both" if row.twins[span] is None
            else f"{row.twins[span].median:.2f} ({row.twins[span].lowest:.2f})" for span in SPANS)
    if side == against:
        return "reference"
    cells = []
    for span in SPANS:
        r = table[span].get(side)
        cells.append(unpaired(row, span, against, not_measured) if r is None else f"{r.median:.2f} ({r.lowest:.2f})")
    if len(set(cells)) == 1 and table[SPANS[0]].get(side) is None:
        return cells[0]  # one reason for every span
    return " / ".join(cells)


def recovery_cell(row: Row, side: str) -> str:
    if side not in ADAPTIVE:
        return ""
    back = row.recovery.get(side)
    if back is not None:
        return f"{num(back.own_s)} own, {num(back.wall_s)} wall"
    if not any(c.span == SPANS[2] for c in row.calls):
        return "no round after the load"
    return "not within the span"


def section(res: UserStart, page: Page) -> None:
    page.add(f"Every row timed one path as a user starts it (the **path timed** column), in fresh processes: "
             f"{res.processes} per row started together and made their first call ({res.first_tokens} new tokens) "
             f"at once, so every row's **warm-ups overlapped**; then {res.new_tokens} new tokens per call, one "
             f"process at a time in rounds, through {res.span_s:.0f} s quiet, {res.span_s:.0f} s with one core "
             f"busy and {res.span_s:.0f} s quiet. tokens/s are medians per span (quiet / busy / quiet, over the "
             f"whole call); ratios are the median (and lowest) over the span's rounds of the path's tokens/s over "
             f"the fixed path's, or ONNX Runtime's, in the same round (the fixed path's row gives its two processes' "
             f"ratio, one over the other, and the farther from 1 of its lowest and highest: the **noise floor** of "
             f"a round's ratio, what chance alone moves it by); recovery is how soon every process of the "
             f"path has a call back within {1 - RECOVERED:.0%} of the fixed path's after the load (and its next "
             f"call too): **own**, the seconds the process spent in its calls after the load until then (what a "
             f"process decoding without pause waits), and **wall**, from the load's end (adding the other "
             f"processes' turns). `one-core`: every process on one core with one thread. \"no round\": the span "
             f"ended before a call began in it (the call before outlasted it).\n")
    for side, why in res.not_measured.items():
        page.add(f"**{side} was not measured**: {why}.\n")
    header = ["condition", "precision", "batch", "path timed", "warm-ups", "first call s", "tokens/s per span",
              "/ fixed per span", "/ ORT per span", "recovery s", "host read GB/s, matmul GFLOP/s", "load 1m"]
    rows = []
    for r in res.rows:
        for side, count in r.processes.items():
            speeds = " / ".join(num(r.tokens_per_s[s][side]) if side in r.tokens_per_s[s] else "no round"
                                for s in SPANS)
            rows.append([r.condition, r.precision, r.batch, LABELS[side],
                         f"overlapped ({count} of {sum(r.processes.values())} processes)",
                         num(statistics.median(r.warm_up_s[side]), 2), speeds,
                         ratios_cell(r, side, "fixed", r.over_fixed, res.not_measured),
                         ratios_cell(r, side, "ORT", r.over_ort, res.not_measured), recovery_cell(r, side),
                         f"{r.host_rates.read_gb_per_s:.1f}, {r.host_rates.matmul_gflop_per_s:.0f}",
                         "-".join(f"{x:.2f}" for x in r.load_average_1m)])
    page.table(header, rows)


EXPERIMENT = Experiment(
    name="user_start", title="Processes started as users start them: the user's paths through a passing load",
    about=__doc__, settings=Settings,
    quick=Settings(processes=5, conditions=["quiet"], batch_sizes=[1, 4], span_s=10.0),
    full=Settings(), result=UserStart, measure=measure, plot=plot, section=section)
