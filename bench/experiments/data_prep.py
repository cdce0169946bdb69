"""Preparing a corpus: tokenizing speed against tiktoken's limit and a datasets.map pipeline, and memory at scale.

    python -m bench.experiments data_prep --sizes-gb 1 5          # about 15 minutes on 2 CPU cores

Speed: the same WikiText text (the shared validation split repeated to `--speed-mb`) tokenized three ways, each in
a fresh process as a user's first start is (bench/workloads/tokenize_split.py), in interleaved rounds: ours (`data.token_files.prepare_split`: read from
the file, cut into documents, encoded by a thread per core, written to the token file), tiktoken's own
multi-threaded `encode_ordinary_batch` on the same documents already in memory (the encoder's limit here: no
reading, no writing, no conversion), and a nanoGPT-style preparation (`datasets.Dataset.map(num_proc=2)` of
`encode_ordinary` over the documents, already an Arrow table, then the tokens written into a `np.memmap` in
shards, as nanoGPT's `prepare.py` does).  Medians with min/max, and the load average of each round.

Memory: `train.py` started on WikiText folders whose training split is that text repeated to each of `--sizes-gb`
(validation and test: the text once), with an empty token cache: the peak resident memory of the whole process
(tokenizing, then one step of the tiny model).  Then the same first start under torchrun with `--ranks` processes
(DDP for 2, tensor parallelism for 4) on the first size, and a second start with the tokens cached: the peak of
all the job's processes together, and how many tokenizers ran.  The folders and caches are deleted afterwards.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiment import Experiment, ExperimentError, ExperimentSettings, SettingsError
from bench.processes import ROOT, STDOUT, run_command, start
from bench.plots import bars, finish, grouped_bars, plt
from bench.report_page import Page, num, spread, timed_as
from bench.train_runs import train_command
from runtime.cli import option
from runtime.timing import Environment, Spread, environment
from training.config import TrainConfig

SHARED_TEXT = ROOT.parent / "shared" / "data" / "wikitext-103-raw" / "wiki.valid.raw"
METHODS = ("ours (prepare_split)", "tiktoken encode_ordinary_batch", "datasets.map, nanoGPT-style")
GB = 1e9
MB = 1e6


@dataclass
class Settings(ExperimentSettings):
    source: Path = option(SHARED_TEXT, "a WikiText raw file whose text is repeated (the shared validation split)")
    speed_mb: float = option(200.0, "megabytes of text tokenized by each method in the speed rounds", above=0)
    repeats: int = option(3, "speed rounds; the methods take turns within a round", min=1)
    sizes_gb: list[float] = option([1.0], "training-split sizes whose first start's memory is measured", above=0)
    ranks: list[int] = option([2, 4], "torchrun process counts started on the first size (0: none)")
    map_processes: int = option(2, "num_proc of the datasets.map preparation (nanoGPT uses 8; this machine has 2 "
                                   "cores)", min=1)

    def __post_init__(self):
        super().__post_init__()
        if any(r == 1 or r < 0 for r in self.ranks):
            raise SettingsError(f"--ranks takes process counts of 2 or more (or 0 for none), got {self.ranks}")


@dataclass
class SpeedRow:
    method: str
    mb_per_s: Spread
    ratio_to_tiktoken: float  # median of ours / theirs


@dataclass
class SplitRun:
    split_bytes: int
    train_tokens: int
    first_start_s: float
    peak_rss_bytes: int  # of the train.py process, tokenizing and training one step


@dataclass
class JobRun:
    ranks: int
    parallel: str
    split_bytes: int
    first_start_s: float
    first_start_peak_rss_bytes: int  # all the job's processes together
    cached_start_s: float
    cached_start_peak_rss_bytes: int
    tokenizers: int  # progress bars that said "tokenizing"


@dataclass
class DataPrep:
    source: str
    speed_text_bytes: int
    encoding_threads: int
    speed: list[SpeedRow]
    load_average_per_round: list[float]
    splits: list[SplitRun]
    jobs: list[JobRun]
    environment: Environment


# --- the text ----------------------------------------------------------------------------------------

def source_text(settings: Settings) -> bytes:
    """The text to repeat: the shared WikiText split, or where this checkout has no ../shared, the built-in
    corpus's validation documents laid out as WikiText articles."""
    if settings.source == SHARED_TEXT and not SHARED_TEXT.is_file():
        from data.corpus import builtin_documents
        print(f"{SHARED_TEXT} is absent: repeating the built-in corpus's validation text instead", flush=True)
        return "".join(f" = Document {i} = \n \n{doc}\n" for i, doc in
                       enumerate(builtin_documents("validation"))).encode()
    if not settings.source.is_file():
        raise ExperimentError(f"{settings.source} is not a file: give --source a WikiText raw file (the shared "
                              f"copy is ../shared/data/wikitext-103-raw/wiki.valid.raw)")
    return settings.source.read_bytes()


def write_wikitext_folder(folder: Path, text: bytes, train_bytes: float) -> int:
    """A folder in WikiText's layout whose training split is `text` repeated to about `train_bytes`."""
    folder.mkdir(parents=True, exist_ok=True)
    copies = max(1, round(train_bytes / len(text)))
    with open(folder / "wiki.train.raw", "wb") as f:
        for _ in range(copies):
            f.write(text)
    for name in ("wiki.valid.raw", "wiki.test.raw"):
        (folder / name).write_bytes(text)
    return copies * len(text)


# --- the speed rounds: each method in a fresh process --------------------------------------------------

def run_child(method: str, folder: Path, cache: Path, settings: Settings) -> dict:
    shutil.rmtree(cache, ignore_errors=True)
    env = {"GPT2_DATA_CACHE": str(cache), "HF_DATASETS_CACHE": str(cache / "hf"), "TQDM_DISABLE": "1"}
    done = run_command([sys.executable, "-m", "bench.workloads.tokenize_split", method, str(folder),
                        str(settings.map_processes)], env=env)
    if not done.ok:
        raise ExperimentError(f"the {method} tokenizer failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_speed(settings: Settings, text: bytes, work: Path) -> tuple[list[SpeedRow], list[float], int, int]:
    folder = work / "speed"
    text_bytes = write_wikitext_folder(folder, text, settings.speed_mb * MB)
    seconds = {m: [] for m in ("ours", "tiktoken", "map")}
    loads, threads = [], 1
    for round_ in range(settings.repeats):
        loads.append(os.getloadavg()[0])
        for method in seconds:
            result = run_child(method, folder, work / "speed-cache", settings)
            seconds[method].append(result["seconds"])
            threads = result["threads"]
            print(f"round {round_ + 1}/{settings.repeats}: {method:9} {text_bytes / MB / result['seconds']:6.1f} MB/s",
                  flush=True)
    tiktoken = Spread.of([text_bytes / MB / s for s in seconds["tiktoken"]]).median
    rows = []
    for method, label in zip(seconds, METHODS):
        rate = Spread.of([text_bytes / MB / s for s in seconds[method]])
        rows.append(SpeedRow(label, rate, rate.median / tiktoken))
    shutil.rmtree(folder)
    return rows, loads, text_bytes, threads


# --- memory: train.py's first start ------------------------------------------------------------------

def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                total += next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    stack += [int(c) for c in children.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def run_measured(command: list[str], env: dict) -> tuple[float, int, str]:
    """(seconds, peak resident bytes of the process tree sampled every 0.1 s, stdout + stderr); `env`: variables
    set for it."""
    proc = start(command, env=env, stderr=STDOUT)
    peak = [0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(0.1)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    done = proc.finish()
    sampler.join()
    if not done.ok:
        raise ExperimentError(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}")
    return done.seconds, peak[0], done.stdout


def first_start(folder: Path, out: Path, parallel: str = "none") -> TrainConfig:
    """One step of the tiny model on `folder`'s text: train.py's first start, tokenizing included."""
    return TrainConfig(model="tiny", dataset=str(folder), max_steps=1, batch_size=4, block_size=64, eval_interval=1000,
                       final_eval_batches=1, curves=False, out_dir=str(out), overwrite=True, parallel=parallel)


def measure_first_starts(settings: Settings, text: bytes, work: Path) -> tuple[list[SplitRun], list[JobRun]]:
    from data.token_files import read_tokens
    splits, jobs = [], []
    for size in settings.sizes_gb:
        folder, cache = work / f"wikitext-{size:g}gb", work / "cache"
        split_bytes = write_wikitext_folder(folder, text, size * GB)
        shutil.rmtree(cache, ignore_errors=True)
        env = {"GPT2_DATA_CACHE": str(cache)}
        seconds, peak, _ = run_measured(train_command(first_start(folder, work / "run")), env)
        tokens = sum(len(read_tokens(p)) for p in cache.rglob("train.bin"))
        splits.append(SplitRun(split_bytes, tokens, seconds, peak))
        print(f"{split_bytes / GB:.2f} GB training split: first start {seconds:.0f} s, peak RSS {peak / 2**30:.2f} GiB",
              flush=True)
        if size == settings.sizes_gb[0]:
            for ranks in (r for r in settings.ranks if r):
                jobs.append(measure_job(ranks, folder, split_bytes, cache, env, work))
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(folder)
    return splits, jobs


def measure_job(ranks: int, folder: Path, split_bytes: int, cache: Path, env: dict, work: Path) -> JobRun:
    parallel = "ddp" if ranks == 2 else "tp"
    command = train_command(first_start(folder, work / f"run-{ranks}", parallel), ranks)
    env = {**env, "OMP_NUM_THREADS": "1"}
    shutil.rmtree(cache, ignore_errors=True)
    first_s, first_peak, output = run_measured(command, env)
    cached_s, cached_peak, _ = run_measured(command, env)
    tokenizers = sum(line.startswith("data: tokenized") and " train " in line for line in output.splitlines())
    print(f"torchrun {ranks} ranks ({parallel}): first start {first_s:.0f} s, peak {first_peak / 2**30:.2f} GiB; "
          f"cached {cached_s:.0f} s, peak {cached_peak / 2**30:.2f} GiB; {tokenizers} tokenizer(s)", flush=True)
    return JobRun(ranks, parallel, split_bytes, first_s, first_peak, cached_s, cached_peak, tokenizers)


def measure(settings: Settings, work_dir: Path) -> DataPrep:
    text = source_text(settings)
    work_dir.mkdir(parents=True, exist_ok=True)
    speed, loads, speed_bytes, threads = measure_speed(settings, text, work_dir)
    splits, jobs = measure_first_starts(settings, text, work_dir)
    return DataPrep(str(settings.source), speed_bytes, threads, speed, loads, splits, jobs,
                    environment(torch.device("cpu")))


# --- plot and report -----------------------------------------------------------------------------

def plot(result: DataPrep):
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    bars(left, [r.method for r in result.speed], [r.mb_per_s for r in result.speed], horizontal=True,
         color=["tab:blue", "tab:grey", "tab:orange"])
    left.set_xlabel("MB of text per second (median, min-max)")
    left.invert_yaxis()
    labels = [f"{s.split_bytes / GB:.1f} GB, 1 process" for s in result.splits]
    labels += [f"{j.split_bytes / GB:.1f} GB, {j.ranks} ranks" for j in result.jobs]
    first = [s.peak_rss_bytes / 2**30 for s in result.splits] + [j.first_start_peak_rss_bytes / 2**30
                                                                   for j in result.jobs]
    cached = [0.0] * len(result.splits) + [j.cached_start_peak_rss_bytes / 2**30 for j in result.jobs]
    grouped_bars(right, labels, {"first start (tokenizing)": first, "tokens cached": cached}, horizontal=True)
    right.invert_yaxis()
    right.set_xlabel("peak resident memory, GiB (all processes)")
    right.legend(fontsize=8)
    return finish(fig, (left, right), grid="x")


def section(res: DataPrep, page: Page) -> None:
    page.add(f"Tokenizing {res.speed_text_bytes / MB:,.0f} MB of WikiText text (the shared validation split "
             f"repeated), each method in a fresh process, {len(res.load_average_per_round)} interleaved rounds "
             f"(load average at each round's start: {', '.join(f'{x:.2f}' for x in res.load_average_per_round)}); "
             f"{res.encoding_threads} encoding threads.\n")
    page.add(timed_as("each way of tokenizing in a fresh process, one at a time in interleaved rounds",
                      "none: each process's first start is what is timed"))
    page.table(["method", "MB/s (median, min-max)", "x tiktoken's limit"],
               [[r.method, spread(r.mb_per_s, 1), f"{r.ratio_to_tiktoken:.2f}x"] for r in res.speed])
    page.add("First starts of `train.py` with an empty token cache (tokenizing, then one step of the tiny model):\n")
    page.table(["training split", "tokens", "first start s", "peak RSS GiB"],
               [[f"{s.split_bytes / GB:.2f} GB", f"{s.train_tokens:,}", num(s.first_start_s, 0),
                 f"{s.peak_rss_bytes / 2**30:.2f}"] for s in res.splits])
    if res.jobs:
        page.add("The same first start under torchrun, and a second start with the tokens cached (peak of all the "
                 "job's processes together; the difference is what tokenizing adds):\n")
        page.table(["ranks", "mode", "tokenizers", "first start s", "peak GiB", "cached start s", "peak GiB",
                    "added by tokenizing GiB"],
                   [[j.ranks, j.parallel, j.tokenizers, num(j.first_start_s, 0),
                     f"{j.first_start_peak_rss_bytes / 2**30:.2f}", num(j.cached_start_s, 0),
                     f"{j.cached_start_peak_rss_bytes / 2**30:.2f}",
                     f"{(j.first_start_peak_rss_bytes - j.cached_start_peak_rss_bytes) / 2**30:.2f}"]
                    for j in res.jobs])


EXPERIMENT = Experiment(
    name="data_prep", title="Data preparation", about=__doc__, settings=Settings,
    quick=Settings(speed_mb=100.0, repeats=3, sizes_gb=[1.0], ranks=[2]),
    full=Settings(speed_mb=200.0, repeats=3, sizes_gb=[1.0, 5.0], ranks=[2, 4]),
    result=DataPrep, measure=measure, plot=plot, section=section)
