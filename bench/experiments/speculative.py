"""Speculative decoding with the project's own drafts: a trained target, drafts row-pruned from it, a smaller
trained preset and its int8 copy, timed against the target decoding alone on its fastest path.

    python -m bench.experiments speculative       # small-cpu trained 1,000 steps; row 50% and 75% drafts; tiny
                                                  # and tiny int8

The models are made by the project's own tools in the work folder (out/bench/speculative/): `train.py` trains
the target and the smaller draft on the same text, `prune/iterative.py --method row` prunes the target into two
more drafts (heads and MLP units removed, fine-tuned after each round), and `quantize/dynamic.py --head int8`
quantizes the smaller draft.  A folder made by the same command
(recorded beside it as bench_command.json) is reused; any other is made again.  On random weights acceptance says
nothing, so every figure here comes from trained models.

Then, for each batch size, every round times the target alone (`generate()`'s default decode, the traced steps
on the CPU), each draft decoding alone (its cost), and the target with each draft at each --draft-tokens K, in
turns whose order reverses every other round, on prompts of English from the built-in corpus's validation split
(a new window per round), greedy at each batch size and sampled (seeded) at batch 1, a fixed number of new tokens
(end-of-text does not stop a row).  Speed-ups are medians of per-round paired ratios; acceptance is summed over the
rounds; every greedy speculative run's tokens are compared with the target's own.  Then `python -m serve --draft`
is timed against the server alone (bench/draft_server_comparison.py).  The text each batch's target decodes
is reported with it: greedy decoding of a small CPU-trained model can settle into a run of one token (a newline),
which any draft predicts, so the sampled rows are the ones that show a draft's acceptance on text.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.experiment import Experiment, ExperimentError, ExperimentSettings, SettingsError
from bench.experiments.generate_speed import real_prompts
from bench.processes import ROOT, STDOUT, run_command
from bench.plots import finish, plt
from bench.report_page import Page, decode_path, num, timed_as
from bench.train_runs import TRAIN_SCRIPT
from bench.draft_server_comparison import ServerComparison, compare_servers
from data.tokenizer import decode
from model.config import PRESETS
from decode.generate import generate
from decode.sampling import SamplingParams
from decode.speculative import DEFAULT_DRAFT_TOKENS, SpeculativeStats
from prune.config import PruneConfig
from quantize.dynamic import QuantizeConfig
from runtime.cli import non_default_flags, option
from runtime.progress import ProgressBar
from runtime.timing import Environment, Spread, environment, paired_ratio, timed_call
from storage.artifact import load_model
from training.config import TrainConfig

TOKENS_NOTE = {True: "the target's own", False: "DIFFERENT", None: "sampled"}
COMMAND_RECORD = "bench_command.json"  # the command that made a model folder, to reuse it only for the same one
TARGET = "target"


@dataclass
class Settings(ExperimentSettings):
    dataset: str = option("builtin", "training text of the target and the smaller draft (a dataset name or folder)")
    target_preset: str = option("small-cpu", "the target's model preset", choices=tuple(PRESETS))
    draft_preset: str | None = option("tiny", "a smaller preset trained on the same text as a draft (none: only "
                                              "pruned drafts)", choices=tuple(PRESETS))
    int8_draft: bool = option(True, "also time the smaller draft quantized by `quantize/dynamic.py --head int8` "
                                    "(its linears, embedding and head in int8)")
    train_steps: int = option(1000, "training steps of the target and of the smaller draft", min=1)
    train_batch_size: int = option(4, "their training batch", min=1)
    train_block_size: int = option(256, "their training context", min=1)
    prune_targets: list[float] = option([0.5, 0.75], "row-pruning targets of the pruned drafts: the share of each "
                                                     "layer's heads and MLP units removed", above=0, below=1,
                                     may_be_empty=True)
    prune_rounds: int = option(2, "prune/iterative.py rounds per pruned draft", min=1)
    prune_finetune_steps: int = option(100, "fine-tuning steps after each pruning round", min=0)
    draft_tokens: list[int] = option([2, 4, 6, 8], "draft tokens per step (K) to time", min=1)
    batch_sizes: list[int] = option([1, 4], "rows decoded together", min=1)
    prompt_tokens: int = option(32, "prompt length", min=1)
    new_tokens: int = option(128, "new tokens per row", min=1)
    rounds: int = option(7, "timed rounds (after one warm-up)", min=1)
    sampled_temperature: float = option(0.8, "also time batch 1 sampling at this temperature (seeded), for the "
                                             "acceptance of sampled tokens (0: greedy only)", min=0)
    server_clients: list[int] = option([1, 4], "concurrency levels at which `python -m serve --draft` (with the "
                                               "draft that paid best for one greedy row, at the default K) is timed "
                                               "against the server alone (none: no servers)", min=1,
                                     may_be_empty=True)
    threads: int | None = option(None, "CPU threads for torch (default: torch's choice)", min=1)

    def __post_init__(self):
        super().__post_init__()
        if self.prompt_tokens + self.new_tokens > self.train_block_size:
            raise SettingsError(f"--prompt-tokens + --new-tokens ({self.prompt_tokens + self.new_tokens}) exceed "
                                f"the models' context (--train-block-size {self.train_block_size})")
        if not self.prune_targets and self.draft_preset is None:
            raise SettingsError("no draft to time: give --prune-targets or --draft-preset")


@dataclass
class ModelRecord:
    name: str
    folder: str
    parameters: int
    command: str  # what made it


@dataclass
class Variant:
    draft: str
    draft_tokens: int
    tokens_per_s: Spread
    speedup: float  # median of per-round paired ratios: the target alone's time over this one's
    acceptance_rate: float
    tokens_per_target_pass: float  # tokens a row gains per target pass (1: plain decoding; K + 1 the most)
    identical_tokens: bool | None  # every round's tokens equal the target's own (None: sampled, not compared)


@dataclass
class BatchResult:
    batch_size: int
    temperature: float  # 0: greedy
    target_text: str  # the start of what the target alone decoded from the first timed prompt
    target_tokens_per_s: Spread
    draft_cost: dict[str, float]  # each draft decoding alone: its time over the target's (median of rounds)
    variants: list[Variant]


@dataclass
class SpeculativeSpeed:
    target: ModelRecord
    drafts: list[ModelRecord]
    prompt_tokens: int
    new_tokens: int
    rounds: int
    batches: list[BatchResult]
    server: ServerComparison | None  # None: --server-clients gave no level
    environment: Environment


def recorded_command(folder: Path) -> list[str] | None:
    """What made `folder`, or None where nothing readable says so (a damaged record means: make it again)."""
    try:
        return json.loads((folder / COMMAND_RECORD).read_text())
    except (OSError, ValueError):
        return None


def make_model(folder: Path, command: list[str], record: list[str]) -> str:
    """Run `command` to make the model in `folder`, unless the folder holds one made by the same `record`."""
    if recorded_command(folder) == record and (folder / "config.json").exists():
        print(f"reusing {folder} (made by the same command)", flush=True)
        return " ".join(command)
    if folder.exists():  # the benchmark's own scratch model, made by other settings
        shutil.rmtree(folder)
    print(" ".join(command), flush=True)
    done = run_command(command, stderr=STDOUT)
    if not done.ok:
        raise ExperimentError(f"making {folder} failed (exit code {done.returncode}):\n{done.stdout[-2000:]}")
    (folder / COMMAND_RECORD).write_text(json.dumps(record))
    return " ".join(command)


def train_flags(settings: Settings, preset: str, folder: Path) -> list[str]:
    config = TrainConfig(model=preset, dataset=settings.dataset, max_steps=settings.train_steps,
                         batch_size=settings.train_batch_size, block_size=settings.train_block_size,
                         eval_interval=max(1, settings.train_steps // 4), log_interval=50, out_dir=str(folder))
    return non_default_flags(config)


@dataclass(frozen=True)
class ModelJob:
    name: str
    folder: Path
    command: list[str]
    record: list[str]  # what the folder's COMMAND_RECORD must hold to be reused


def model_jobs(settings: Settings, work_dir: Path) -> list[ModelJob]:
    """The target first, then every draft: how each is made."""
    target = work_dir / TARGET
    target_flags = train_flags(settings, settings.target_preset, target)
    jobs = [ModelJob(TARGET, target, train_command_for(target_flags), target_flags)]
    for share in settings.prune_targets:
        folder = work_dir / f"row-{share:g}"
        config = PruneConfig(target=share, method="row", checkpoint=str(target), rounds=settings.prune_rounds,
                             finetune_steps=settings.prune_finetune_steps, dataset=settings.dataset,
                             out_dir=str(folder), speed_repeats=1, generation_tokens=8)
        flags = non_default_flags(config)
        # Recorded with the target's flags: a target made again makes its pruned drafts again.
        jobs.append(ModelJob(f"row {share:.0%}", folder, [sys.executable, str(ROOT / "prune" / "iterative.py"),
                                                          *flags], flags + target_flags))
    if settings.draft_preset is not None:
        folder = work_dir / f"draft-{settings.draft_preset}"
        flags = train_flags(settings, settings.draft_preset, folder)
        jobs.append(ModelJob(settings.draft_preset, folder, train_command_for(flags), flags))
        if settings.int8_draft:
            int8_folder = work_dir / f"draft-{settings.draft_preset}-int8"
            config = QuantizeConfig(checkpoint=str(folder), out_dir=str(int8_folder), head="int8",
                                    dataset=settings.dataset, repeats=1, new_tokens=8)
            int8_flags = non_default_flags(config)
            jobs.append(ModelJob(f"{settings.draft_preset} int8", int8_folder,
                                 [sys.executable, str(ROOT / "quantize" / "dynamic.py"), *int8_flags],
                                 int8_flags + flags))
    return jobs


def train_command_for(flags: list[str]) -> list[str]:
    return [sys.executable, str(TRAIN_SCRIPT), *flags]


def measure(settings: Settings, work_dir: Path) -> SpeculativeSpeed:
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    jobs = model_jobs(settings, work_dir)
    commands = {job.name: make_model(job.folder, job.command, job.record) for job in jobs}
    folders = {job.name: job.folder for job in jobs}
    models = {name: load_model(folder)[0] for name, folder in folders.items()}
    records = {name: ModelRecord(name, str(folder), models[name].num_parameters(), commands[name])
               for name, folder in folders.items()}
    drafts = [name for name in models if name != TARGET]
    target = models[TARGET]
    greedy = SamplingParams(max_new_tokens=settings.new_tokens, temperature=0, stop_at_eot=False)
    runs = [(batch, greedy, settings.draft_tokens) for batch in settings.batch_sizes]
    if settings.sampled_temperature > 0:
        sampled = dataclasses.replace(greedy, temperature=settings.sampled_temperature, seed=0)
        runs.append((1, sampled, settings.draft_tokens))
    batches = []
    for batch, params, draft_tokens in runs:
        prompts = real_prompts(batch * (settings.rounds + 1), settings.prompt_tokens).view(
            settings.rounds + 1, batch, settings.prompt_tokens)
        batches.append(time_batch(target, models, drafts, prompts, params, draft_tokens))
        print_batch(batches[-1])
    server = None
    if settings.server_clients:
        # The draft that paid best greedy at the first batch size and the default K (any K, if that is not timed).
        variants = batches[0].variants
        name = max([v for v in variants if v.draft_tokens == DEFAULT_DRAFT_TOKENS] or variants,
                   key=lambda v: v.speedup).draft
        server = compare_servers(folders[TARGET], name, folders[name], DEFAULT_DRAFT_TOKENS, settings.server_clients,
                                 settings.new_tokens, settings.rounds, work_dir)
    return SpeculativeSpeed(records[TARGET], [records[name] for name in drafts], settings.prompt_tokens,
                            settings.new_tokens, settings.rounds, batches, server, environment(torch.device("cpu")))


def time_batch(target, models: dict, drafts: list[str], prompts: torch.Tensor, params: SamplingParams,
               draft_tokens: list[int]) -> BatchResult:
    """Round r decodes prompts[r] (rounds + 1, batch, length) with every call in turn; round 0 is not timed."""
    stats = {(name, k): SpeculativeStats() for name in drafts for k in draft_tokens}
    keys = [(TARGET, 0), *((name, 0) for name in drafts), *stats]  # K 0: decoding alone

    def run(key: tuple, prompt: torch.Tensor, timed: bool) -> torch.Tensor:
        name, k = key
        if k == 0:
            return generate(models[name], prompt, params)
        return generate(target, prompt, params, draft=models[name], draft_tokens=k,
                        stats=stats[key] if timed else SpeculativeStats())

    times: dict[tuple, list[float]] = {key: [] for key in keys}
    identical = {key: True if params.greedy else None for key in stats}
    target_text = ""
    for round_ in ProgressBar(range(prompts.size(0)), desc=f"speculative, batch {prompts.size(1)}, temperature "
                                                          f"{params.temperature:g}", unit="round"):
        tokens = {}
        for key in keys[::-1] if round_ % 2 else keys:  # none always runs first
            elapsed = timed_call(lambda: tokens.__setitem__(key, run(key, prompts[round_], round_ > 0)))
            if round_ > 0:
                times[key].append(elapsed)
        if params.greedy:
            for key in stats:
                identical[key] &= torch.equal(tokens[key], tokens[(TARGET, 0)])
        if round_ == 1:
            target_text = decode(tokens[(TARGET, 0)][0, prompts.size(2):].tolist())[:300]
    new = prompts.size(1) * params.max_new_tokens
    reference = times[(TARGET, 0)]
    variants = [Variant(name, k, Spread.of([new / t for t in times[(name, k)]]),
                        paired_ratio(reference, times[(name, k)]), stats[(name, k)].acceptance_rate,
                        stats[(name, k)].tokens_per_target_pass, identical[(name, k)]) for name, k in stats]
    cost = {name: paired_ratio(times[(name, 0)], reference) for name in drafts}
    return BatchResult(prompts.size(1), params.temperature, target_text, Spread.of([new / t for t in reference]),
                       cost, variants)


def print_batch(result: BatchResult) -> None:
    print(f"batch {result.batch_size}, temperature {result.temperature:g}: target alone "
          f"{result.target_tokens_per_s.median:.1f} tokens/s; draft cost "
          + ", ".join(f"{name} {cost:.2f}" for name, cost in result.draft_cost.items()))
    for v in result.variants:
        print(f"  {v.draft:>8s} K={v.draft_tokens}: {v.tokens_per_s.median:7.1f} tokens/s, {v.speedup:.2f}x, "
              f"acceptance {v.acceptance_rate:.1%}, {v.tokens_per_target_pass:.2f} tokens/pass, "
              f"{TOKENS_NOTE[v.identical_tokens]} tokens", flush=True)


def plot(result: SpeculativeSpeed):
    fig, axes = plt.subplots(1, len(result.batches), figsize=(5 * len(result.batches), 3.6), squeeze=False)
    for ax, batch in zip(axes[0], result.batches):
        for draft in result.drafts:
            points = [v for v in batch.variants if v.draft == draft.name]
            ax.plot([v.draft_tokens for v in points], [v.speedup for v in points], marker="o",
                    label=f"{draft.name} (cost {batch.draft_cost[draft.name]:.2f})")
        ax.axhline(1, color="grey", linestyle=":")
        ax.set_xlabel("draft tokens per step (K)")
        ax.set_ylabel("speed-up over the target alone")
        ax.set_title(f"batch {batch.batch_size}, " + ("greedy" if batch.temperature == 0 else
                                                       f"temperature {batch.temperature:g}"))
    return finish(fig, axes[0], f"speculative decoding: target {result.target.parameters:,} parameters, "
                                f"{result.new_tokens} new tokens", legend=True)


def section(res: SpeculativeSpeed, page: Page) -> None:
    page.add(f"Target: `{res.target.command}` ({res.target.parameters:,} parameters). Drafts: "
             + "; ".join(f"{d.name}, {d.parameters:,} parameters (`{d.command}`)" for d in res.drafts)
             + f". {res.prompt_tokens}-token prompts, {res.new_tokens} new tokens, medians of {res.rounds} "
             f"rounds interleaved with the target alone (its default decode), {res.environment.threads} "
             f"thread(s). Cost: a draft decoding alone, its time over the target's.\n")
    page.add(timed_as(f"`generate()` with {decode_path('auto')}, the target alone and with each draft, in this one "
                      f"process, on models loaded by load_model and not packed as sample.py packs them",
                      "not overlapped: the first round, one call after another in this process, is "
                      "untimed"))
    for batch in res.batches:
        how = "greedy" if batch.temperature == 0 else f"sampling at temperature {batch.temperature:g} (seeded)"
        page.add(f"Batch {batch.batch_size}, {how}: the target alone decodes {num(batch.target_tokens_per_s.median)} "
                 f"tokens/s; its text from the first timed prompt begins {json.dumps(batch.target_text[:160])}.\n")
        page.table(["draft", "cost", "K", "acceptance", "tokens per pass", "tokens/s", "speed-up", "tokens"],
                   [[v.draft, f"{batch.draft_cost[v.draft]:.2f}", str(v.draft_tokens), f"{v.acceptance_rate:.1%}",
                     f"{v.tokens_per_target_pass:.2f}", num(v.tokens_per_s.median), f"{v.speedup:.2f}x",
                     TOKENS_NOTE[v.identical_tokens]] for v in batch.variants])
    if res.server is not None:
        server_section(res.server, page)


def server_section(server: ServerComparison, page: Page) -> None:
    page.add(f"The server: `python -m serve --draft` ({server.draft}, K = {server.draft_tokens}) against the same "
             f"target served alone, streaming `/generate` requests of {server.new_tokens} new tokens (the load "
             f"test's prompts; sampled: temperature 0.8, top-k 200), medians of {server.rounds} interleaved rounds "
             f"(bench/draft_server_comparison.py).\n")
    page.add(timed_as(f"`python -m serve` with and without `--draft`, {decode_path('auto')}",
                      "the two servers started at once, so their start-up warm-ups overlapped (2 processes); the first "
                      "round is untimed"))
    page.table(["clients", "decoding", "alone, tokens/s", "with the draft, tokens/s", "speed-up", "acceptance",
                "latency p50 alone / with the draft, ms"],
               [[str(lv.clients), lv.decoding, num(lv.alone_tokens_per_s.median),
                 num(lv.speculative_tokens_per_s.median), f"{lv.speedup:.2f}x", f"{lv.acceptance_rate:.1%}",
                 f"{lv.alone_latency_ms:.0f} / {lv.speculative_latency_ms:.0f}"] for lv in server.levels])


EXPERIMENT = Experiment(
    name="speculative", title="Speculative decoding with pruned and smaller drafts", about=__doc__,
    settings=Settings,
    quick=Settings(train_steps=100, prune_targets=[0.5], prune_rounds=1, prune_finetune_steps=10, draft_tokens=[4],
                   batch_sizes=[1], new_tokens=64, rounds=1, sampled_temperature=0, server_clients=[1]),
    full=Settings(),
    result=SpeculativeSpeed, measure=measure, plot=plot, section=section)
