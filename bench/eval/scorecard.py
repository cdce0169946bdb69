"""The scorecard of one artifact, measured: the configuration, the plan checked against the model's context, the
validation loss, generation and training throughput, and the record of each figure with its unit, definition and
spread.  `python bench/leaderboard.py` is its command; its help says what the five keys mean.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from bench.eval.score_file import FIGURES, Progress, kept_measurements, parse_figures, write
from bench.train_runs import run_train, window_summary
from data.corpus import Corpus, dataset_help
from data.documents import text_blocks
from data.loader import eval_batches
from data.local_files import TEXT_FIX, whole_file_corpus
from data.token_files import load_split, prepare_split
from training.evaluate import evaluate_loss
from decode.generate import generate
from model.gpt import GPT
from model.packed_linear import pack_for_inference
from decode.sampling import SamplingParams
from parallel.layout import MULTI_PROCESS_MODES
from runtime.cli import check_options, option
from runtime.device import choose_device, peak_memory_bytes, precision_policy, synchronize
from runtime.errors import UserError
from runtime.progress import Heartbeat, ProgressBar, duration
from runtime.stopping import Stopped
from runtime.provenance import provenance
from runtime.timing import Spread, environment, time_repeats
from storage.artifact import load_model, save_artifact
from storage.run_folder import evaluation_context, evaluation_dataset, pick_checkpoint
from training.config import TrainConfig

GENERATION_BATCHES = (1, 12)
TRAINING_BATCHES = (4, 12)
REFERENCE_NEW_TOKENS = 500
UNITS = {
    "loss": "nats per token (mean cross-entropy)",
    "inference_latency_1": "new tokens per second",
    "inference_latency_12": "new tokens per second",
    "training_throughput_4": "training tokens per second (whole job)",
    "training_throughput_12": "training tokens per second (whole job)",
    "time_to_first_token_s": "seconds",
    "ms_per_token_batch_1": "milliseconds per new token",
    "peak_memory_bytes": "bytes",
}


DEFAULT_DATASET = "wikitext-103"  # for a checkpoint that records no training dataset
# The reference scorecard's protocol: gradient accumulation per optimizer step (this project's default: 1).
REFERENCE_GRAD_ACCUM = 40
REFERENCE_BLOCK = 128
PROTOCOLS = {"default": 1, "reference": REFERENCE_GRAD_ACCUM}


class LeaderboardError(UserError):
    """Settings that cannot work, or a training run that failed; printed without a traceback."""


@dataclass
class LeaderboardConfig:
    checkpoint: str | None = option(None, "artifact folder or Hugging Face GPT-2 id (default: the train.py checkpoint under out/ trained on "
                                          "the most tokens)")
    dataset: str | None = option(None, f"evaluation corpus, validation split: {dataset_help()} (default: the "
                                       f"checkpoint's training dataset, else {DEFAULT_DATASET})")
    eval_text: Path | None = option(None, "evaluate on this local text file instead of "
                                          "--dataset (all of it)")
    eval_batch_size: int = option(8, "evaluation windows per forward pass", min=1)
    eval_block_size: int | None = option(None, "evaluation window (default: the block size the model was "
                                               "trained at, else its context)", min=1)
    prompt_tokens: int = option(16, "prompt length for the generation figures", min=1)
    new_tokens: int | None = option(None, f"new tokens per generation (default: {REFERENCE_NEW_TOKENS} as the reference, or as many as the "
                                          f"model's context leaves after the prompt, whichever is smaller)", min=1)
    repeats: int = option(3, "timed repeats per figure (after one warm-up)", min=1)
    parallel: str = option("none", "training figures: none (one process) or a torchrun mode of train.py", choices=("none", *MULTI_PROCESS_MODES))
    nproc_per_node: int = option(2, "ranks for --parallel (torchrun)", min=1)
    block_size: int | None = option(None, "training block size (default: the model's "
                                          "context)", min=1)
    train_steps: int = option(3, "optimizer steps per timed training window", min=1)
    train_dataset: str = option("builtin", "training text for the throughput runs (content does not change the speed)")
    threads: int | None = option(None, "torch threads per training rank (default: "
                                       "torch's choice)", min=1)
    device: str = option("auto", "auto, cpu, cuda, ...")
    protocol: str = option("default", f"reference: the reference scorecard's settings (training: grad accumulation {REFERENCE_GRAD_ACCUM} "
                                      f"x micro-batch 4 or 12 x block {REFERENCE_BLOCK}; generation: batch x {REFERENCE_NEW_TOKENS} new "
                                      f"tokens / time); default: this project's", choices=tuple(PROTOCOLS))
    out: Path | None = option(None, "also write the JSON here, each figure as soon as it is measured (with its "
                                    "status), so a run that fails or is stopped keeps what it measured")
    only: str | None = option(None, f"measure only these figures, comma-separated, of {', '.join(FIGURES)} (the "
                                    f"others are left not measured, or with --resume as they are)")
    resume: bool = option(False, "finish the scorecard at --out: keep the figures it holds as measured and measure "
                                 "the rest (same artifact and settings)")

    def __post_init__(self):
        check_options(self, LeaderboardError)
        if self.eval_text is not None and self.dataset is not None:
            raise LeaderboardError("give --dataset or --eval-text, not both")
        if self.only is not None:
            parse_figures(self.only)
        if self.resume and self.out is None:
            raise LeaderboardError("--resume finishes the scorecard at --out; give --out")

    def figures(self) -> tuple[str, ...]:
        return FIGURES if self.only is None else parse_figures(self.only)

    def settings(self, folder: Path) -> dict:
        """What the figures depend on, compared by --resume: every option but where and which to write, with the
        artifact's folder as found."""
        chosen = {key: str(value) if isinstance(value, Path) else value for key, value in asdict(self).items()
                  if key not in ("out", "only", "resume", "checkpoint")}
        return {**chosen, "artifact": str(Path(folder).resolve())}
        if self.parallel not in ("none", *MULTI_PROCESS_MODES):
            raise LeaderboardError(f"--parallel {self.parallel} is not a torchrun mode")


def text_file_corpus(path: Path) -> Corpus:
    """A local text file as a corpus whose validation split is the whole file."""
    if not path.is_file():
        raise LeaderboardError(f"--eval-text {path} is not a file")
    if not any(block.strip() for block in text_blocks(path, TEXT_FIX)):
        raise LeaderboardError(f"--eval-text {path} holds no text")
    return whole_file_corpus(path, "validation")


def evaluation_tokens(args: LeaderboardConfig, dataset: str):
    if args.eval_text:
        return load_split(text_file_corpus(args.eval_text), "validation"), f"file {args.eval_text}"
    return load_split(dataset, "validation"), f"{dataset} validation split"


def chosen_dataset(args: LeaderboardConfig, folder: Path) -> tuple[str, str]:
    """The evaluation text's name and why it was chosen, for the first line and the scorecard."""
    if args.eval_text:
        return str(args.eval_text), "from --eval-text"
    return evaluation_dataset(args.dataset, folder, DEFAULT_DATASET)


def validation_batches(tokens, block: int, batch_size: int) -> int:
    return -(-((len(tokens) - 1 + block - 1) // block) // batch_size)


def validation_loss(model, tokens, block: int, batch_size: int, device, precision, beat: Heartbeat) -> dict:
    """Over all of `tokens`; once the first batch is done, `beat` expects the rest at its pace."""
    n_batches = validation_batches(tokens, block, batch_size)

    def timed(batches):
        start = time.perf_counter()
        for number, batch in enumerate(batches):
            if number == 1:  # the first batch has been evaluated
                first_s = time.perf_counter() - start
                left = first_s * (n_batches - 1)
                beat.expect(left, f"estimate: first validation batch {duration(first_s)}, about {duration(left)} "
                                  f"for the other {n_batches - 1} (generation and training are estimated as each "
                                  f"begins)")
            yield batch
    batches = ProgressBar(timed(eval_batches(tokens, block, batch_size)), total=n_batches, desc="validation",
                          unit=" batch", leave=False)
    return evaluate_loss(model, batches, device, precision.autocast)


def generation_figures(model, tokens, prompt_tokens: int, new_tokens: int, repeats: int, device,
                       beat: Heartbeat, training_runs: int, batches: tuple[int, ...],
                       on_measured: Callable[[int, dict], None]) -> None:
    """Greedy decoding with the KV cache and no early stop, so every run makes exactly `new_tokens` per row, at each
    of `batches`; `on_measured(batch, figure)` takes each batch size's figures as soon as they are measured.  Each
    batch size's warm-up call is its first unit of work: `beat` expects the rest from it."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0, stop_at_eot=False)
    stride = max(1, (len(tokens) - prompt_tokens) // max(GENERATION_BATCHES))
    rows = [torch.from_numpy(tokens[i * stride:i * stride + prompt_tokens].astype("int64"))
            for i in range(max(GENERATION_BATCHES))]
    bar = ProgressBar(total=len(batches) * (repeats + 1), desc="generation throughput", unit=" call",
                      file=sys.stderr)
    for batch in batches:
        beat.phase(f"generation at batch {batch}: {repeats + 1} calls of {new_tokens} new tokens")
        prompt = torch.stack(rows[:batch]).to(device)
        first_token_s = []  # per call: from its start to its first new token
        bar.set_postfix_str(f"batch {batch}")

        def run():
            start, first = time.perf_counter(), []

            def on_token(_token):
                if not first:
                    synchronize(device)
                    first.append(time.perf_counter() - start)

            generate(model, prompt, params, on_token=on_token)
            first_token_s.append(first[0])
            bar.update()
            if len(first_token_s) == 1:  # the warm-up call: this batch size's first unit of work
                call_s = time.perf_counter() - start
                later = [b for b in batches if b > batch]
                beat.expect(call_s * repeats,
                            f"estimate: a generation call at batch {batch} took {duration(call_s)}: about "
                            f"{duration(call_s * repeats)} for its {repeats} timed repeats; then "
                            f"{f'batch {later[0]} (estimated from its first call), ' if later else ''}"
                            f"{training_runs} training runs (estimated when the first ends)")

        totals = time_repeats(run, repeats, warmup=1, device=device)
        ttfts = first_token_s[1:]  # the first call is the warm-up
        on_measured(batch, {
            "tokens_per_s": asdict(Spread.of([batch * new_tokens / total for total in totals])),
            "time_to_first_token_s": asdict(Spread.of(ttfts)),
            # Decoding after the first token (the prompt's prefill is in the time to first token).
            "ms_per_token": asdict(Spread.of([1000 * (total - ttft) / max(1, new_tokens - 1)
                                              for total, ttft in zip(totals, ttfts)])),
            # The scorecard process's peak so far: the model and this batch size's largest cache.
            "peak_memory_bytes": peak_memory_bytes(device),
        })
    bar.close()  # stays on screen with its rate


def trainable_source(folder: Path, meta: dict, workdir: Path) -> Path:
    """The folder train.py starts from: the artifact itself, or for int8 its float architecture."""
    if meta.kind != "int8":
        return folder
    config = meta.model
    float_copy = workdir / "float-architecture"
    save_artifact(float_copy, GPT(config), config, "float", provenance("bench/leaderboard.py", folder))
    return float_copy


class TrainingFailed(Exception):
    """A training sub-run that failed: its micro-batch, the cause in one line, and its last output."""

    def __init__(self, batch: int, cause: str, output_tail: str):
        super().__init__(cause)
        self.batch, self.cause, self.output_tail = batch, cause, output_tail


def training_figures(args: LeaderboardConfig, source: Path, block: int, workdir: Path, grad_accum: int,
                     beat: Heartbeat, batches: tuple[int, ...], on_measured: Callable[[int, dict], None]) -> None:
    """One train.py run per micro-batch size of `batches`, each figure handed to `on_measured` as it ends; the first
    run's time sets the estimate for the rest.  A failed run raises TrainingFailed (what ran before it is kept)."""
    parallel = args.parallel != "none"
    steps = args.train_steps * (args.repeats + 1)
    for number, batch in enumerate(batches, 1):
        config = TrainConfig(init_from=str(source), dataset=args.train_dataset, batch_size=batch, block_size=block,
                             max_steps=steps, log_interval=args.train_steps, eval_interval=steps, eval_batches=1,
                             final_eval_batches=1, warmup_steps=1, parallel=args.parallel, device=args.device,
                             grad_accum=grad_accum, curves=False)
        doing = (f"training throughput ({number}/{len(batches)}): micro-batch {batch} x block {block}"
                 f"{f', {args.parallel} on {args.nproc_per_node} ranks' if parallel else ''}, {steps} steps")
        beat.phase(doing)
        if number == 1:
            beat.expect(None)  # until this run ends
        beat.say(doing)
        run = run_train(workdir / f"train_{batch}", config, nproc=args.nproc_per_node if parallel else None,
                        threads=args.threads)
        if not run.ok:
            raise TrainingFailed(batch, run.failure(), run.output_tail)
        windows = run.timed_windows(skip=1)
        tokens_per_s = window_summary(windows, "tokens_per_s")
        if tokens_per_s is None:
            raise TrainingFailed(batch, f"train.py logged no tokens/s after its first window ({len(run.step_records)} "
                                        f"windows in all); raise --train-steps or --repeats", run.output_tail)
        if number == 1 and len(batches) > 1:
            # A larger micro-batch costs up to proportionally more per step; the process start-up does not grow.
            left = run.elapsed_s * sum(b / batch for b in batches[1:])
            beat.expect(left, f"estimate: the first training run took {duration(run.elapsed_s)}; about "
                              f"{duration(left)} for the rest (at most, as its micro-batch grows)")
        last = run.step_records[-1]
        on_measured(batch, {"tokens_per_s": asdict(tokens_per_s),
                            "peak_memory_bytes": last.get("peak_memory_bytes"),
                            "peak_memory_bytes_per_rank": last.get("peak_memory_bytes_per_rank"),
                            "topology": {key: last.get(key, default) for key, default in
                                         (("nodes", 1), ("processes_per_node", 1), ("backend", None))},
                            "command": " ".join(run.command)})


@dataclass
class Plan:
    """What the scorecard measures, checked against the model's context before anything runs."""
    eval_block: int
    train_block: int
    new_tokens: int
    new_tokens_note: str


def plan(args: LeaderboardConfig, context: int, eval_block: int) -> Plan:
    """`eval_block`: the evaluation window, given or the one the model was trained at."""
    reference = args.protocol == "reference"
    train_block = REFERENCE_BLOCK if reference else args.block_size or context
    if reference and args.prompt_tokens + REFERENCE_NEW_TOKENS > context:
        raise LeaderboardError(f"--protocol reference generates {REFERENCE_NEW_TOKENS} new tokens after the "
                               f"{args.prompt_tokens}-token prompt, which this model's context of {context} cannot "
                               f"hold; score it with --protocol default (or a model with a longer context)")
    if reference and args.new_tokens not in (None, REFERENCE_NEW_TOKENS):
        raise LeaderboardError(f"--protocol reference fixes the new tokens at {REFERENCE_NEW_TOKENS}; "
                               f"drop --new-tokens")
    for name, value in (("--eval-block-size", eval_block), ("--block-size", train_block)):
        if value > context:
            raise LeaderboardError(f"{name} {value} exceeds the model's context of {context}")
    if args.prompt_tokens >= context:
        raise LeaderboardError(f"--prompt-tokens {args.prompt_tokens} leaves no room in the context of {context}")
    if args.new_tokens is not None and args.prompt_tokens + args.new_tokens > context:
        raise LeaderboardError(f"--prompt-tokens + --new-tokens = {args.prompt_tokens + args.new_tokens} exceeds "
                               f"the model's context of {context}")
    new_tokens = args.new_tokens or min(REFERENCE_NEW_TOKENS, context - args.prompt_tokens)
    note = (f"{new_tokens} new tokens: the reference's {REFERENCE_NEW_TOKENS} do not fit after a "
            f"{args.prompt_tokens}-token prompt in this model's context of {context}"
            if args.new_tokens is None and new_tokens < REFERENCE_NEW_TOKENS else f"{new_tokens} new tokens")
    return Plan(eval_block, train_block, new_tokens, note)


@dataclass
class Scoring:
    """One scorecard run: what it scores and how, and its figures so far (bench/eval/score_file.py), written to --out
    whenever one is added."""
    args: LeaderboardConfig
    progress: Progress
    folder: Path
    meta: dict
    plan: Plan
    device: torch.device
    precision: object
    dataset: str  # the evaluation text's name
    dataset_chosen: str  # why it is that one
    described: str  # the evaluation text, in words
    eval_tokens: int
    settings: dict

    def add(self, figure: str, measurement: dict) -> None:
        self.progress.measured(figure, {**measurement, "measured_on": asdict(environment(self.device))})
        self.save()

    def save(self) -> dict:
        score = record(self)
        if self.args.out:
            write(self.args.out, json.dumps(score, indent=2))
        return score

    def measured(self, figure: str) -> dict | None:
        return self.progress.measurements.get(figure)


def generation_key(batch: int) -> str:
    return f"inference_latency_{batch}"


def training_key(batch: int) -> str:
    return f"training_throughput_{batch}"


def start(args: LeaderboardConfig, beat: Heartbeat) -> tuple[Scoring, GPT, object]:
    """Load the model and check the plan (and, resuming, the file at --out) before anything is measured; the
    session, the model and the evaluation tokens."""
    beat.phase("reading the evaluation text and loading the model")
    device = choose_device(args.device)
    folder, why = pick_checkpoint(args.checkpoint)
    settings = args.settings(folder)
    kept = kept_measurements(args.out, settings) if args.resume else {}
    progress = Progress(args.figures(), kept)
    dataset, dataset_chosen = chosen_dataset(args, folder)
    print(f"scoring {folder} ({why}) on {dataset} ({dataset_chosen})"
          f"{'; kept from ' + str(args.out) + ': ' + ', '.join(kept) if kept else ''}", file=sys.stderr)
    # The data first: an unreachable hub or a bad folder fails before the model is loaded.
    tokens, described = evaluation_tokens(args, dataset)
    if len(tokens) <= args.prompt_tokens * max(GENERATION_BATCHES):
        raise LeaderboardError(f"the evaluation text has {len(tokens)} tokens, too few for "
                               f"{max(GENERATION_BATCHES)} prompts of {args.prompt_tokens}")
    prepare_split(args.train_dataset, "train")
    model, meta = load_model(folder, device)
    print(pack_for_inference(model), file=sys.stderr)
    eval_block, warning = evaluation_context(args.eval_block_size, "--eval-block-size", folder, model.config.block_size)
    settled = plan(args, model.config.block_size, eval_block)
    if warning:
        print(warning, file=sys.stderr)
    session = Scoring(args, progress, Path(folder), meta, settled, device, precision_policy(device), dataset,
                      dataset_chosen, described, len(tokens), settings)
    return session, model, tokens


def measure(session: Scoring, model: GPT, tokens, beat: Heartbeat) -> None:
    """Loss, generation, training: each figure the run wants, saved as it is measured."""
    args, settled, device, progress = session.args, session.plan, session.device, session.progress
    if progress.wants("loss"):
        print(f"validation loss over all of {session.described} ({len(tokens):,} tokens)", file=sys.stderr)
        beat.phase(f"validation loss ({validation_batches(tokens, settled.eval_block, args.eval_batch_size)} batches)")
        session.add("loss", validation_loss(model, tokens, settled.eval_block, args.eval_batch_size, device,
                                            session.precision, beat))
    generation = tuple(b for b in GENERATION_BATCHES if progress.wants(generation_key(b)))
    training = tuple(b for b in TRAINING_BATCHES if progress.wants(training_key(b)))
    if generation:
        print(f"generation throughput: {settled.new_tokens_note}, batches {generation}", file=sys.stderr)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        generation_figures(model, tokens, args.prompt_tokens, settled.new_tokens, args.repeats, device, beat,
                           len(training), generation, lambda b, figure: session.add(generation_key(b), figure))
    del model
    if not training:
        return
    with tempfile.TemporaryDirectory(prefix="leaderboard-") as tmp:
        # Resolved: train.py runs from the project root (bench/processes.py), not where a relative path was given.
        source = trainable_source(session.folder.resolve(), session.meta, Path(tmp))
        training_figures(args, source, settled.train_block, Path(tmp), PROTOCOLS[args.protocol], beat, training,
                         lambda b, figure: session.add(training_key(b), figure))


def spread_median(spread: dict | None) -> float | None:
    return None if spread is None else spread["median"]


def record(session: Scoring) -> dict:
    """The scorecard as far as it is measured: the five keys (None until measured), each figure's status, their
    units and definitions, how each was measured, and the raw measurements --resume reads back."""
    args, p, progress = session.args, session.plan, session.progress
    loss = session.measured("loss")
    generation = {b: session.measured(generation_key(b)) for b in GENERATION_BATCHES}
    training = {b: session.measured(training_key(b)) for b in TRAINING_BATCHES}
    measured_training = [figure for figure in training.values() if figure]
    first_batch = generation[1] or {}
    world = args.nproc_per_node if args.parallel != "none" else 1
    inference_peaks = [figure["peak_memory_bytes"] for figure in generation.values()
                       if figure and figure["peak_memory_bytes"] is not None]
    score = {
        "loss": loss["val_loss"] if loss else None,
        **{generation_key(b): spread_median(figure and figure["tokens_per_s"]) for b, figure in generation.items()},
        **{training_key(b): spread_median(figure and figure["tokens_per_s"]) for b, figure in training.items()},
        "complete": progress.complete,
        "status": progress.status,
        "units": UNITS,
        "definitions": {
            "loss": f"token-weighted mean cross-entropy over every target of {session.described}"
                    f"{' (' + format(loss['val_tokens'], ',') + ' targets)' if loss else ''}, non-overlapping "
                    f"windows of {p.eval_block} tokens",
            **{generation_key(b): f"generation throughput at batch {b}: {b} x {p.new_tokens} new tokens / "
                                  f"seconds of generate() (greedy, KV cache, {args.prompt_tokens}-token "
                                  f"prompts, prefill included); a throughput despite the name"
               for b in GENERATION_BATCHES},
            **{training_key(b): f"training tokens per second at micro-batch {b} per rank x block "
                                f"{p.train_block}, {'one process' if world == 1 else f'{args.parallel} on {world} ranks, all ranks together'}: "
                                f"train.py's own tokens/s (forward, backward, optimizer; evaluation "
                                f"and checkpoints excluded)" for b in TRAINING_BATCHES},
            "time_to_first_token_s": "batch 1: from the generate() call to the first new token (prompt prefill)",
            "ms_per_token_batch_1": "batch 1: decoding time after the first token / (new tokens - 1)",
            "peak_memory_bytes": "CUDA: allocator peak; CPU: the process's peak resident set (the scorecard "
                                 "process for inference, each train.py process for training)",
            "spread": "each figure is the median of its repeats after one warm-up; min and max beside it",
            "status": "per figure: measured (this run, or kept from the file --resume finished), failed (with its "
                      "cause) or not measured (with why); `measurements` holds each one's raw figures and the host "
                      "it was measured on",
        },
        "time_to_first_token_s": spread_median(first_batch.get("time_to_first_token_s")),
        "ms_per_token_batch_1": spread_median(first_batch.get("ms_per_token")),
        "peak_memory_bytes": {"inference": max(inference_peaks) if inference_peaks else None,
                              **{f"training_{b}": figure and figure["peak_memory_bytes"]
                                 for b, figure in training.items()}},
        "spread": {**{generation_key(b): figure["tokens_per_s"] for b, figure in generation.items() if figure},
                   **{training_key(b): figure["tokens_per_s"] for b, figure in training.items() if figure},
                   **({"time_to_first_token_s": first_batch["time_to_first_token_s"],
                       "ms_per_token_batch_1": first_batch["ms_per_token"]} if first_batch else {})},
        "artifact": {"path": str(session.folder), "kind": session.meta.kind,
                     "produced_by": asdict(session.meta.produced_by), "model": session.meta.model.to_dict()},
        "evaluation": {"dataset": session.dataset, "dataset_chosen": session.dataset_chosen, "text": session.described,
                       "tokens": session.eval_tokens, "targets": loss["val_tokens"] if loss else None,
                       "block_size": p.eval_block, "batch_size": args.eval_batch_size,
                       "val_ppl": loss["val_ppl"] if loss else None,
                       "precision": str(session.precision.autocast_dtype or torch.float32)},
        "generation": {"prompt_tokens": args.prompt_tokens, "new_tokens": p.new_tokens, "note": p.new_tokens_note,
                       "repeats": args.repeats},
        "protocol": {"name": args.protocol, "grad_accum": PROTOCOLS[args.protocol],
                     "training_block_size": p.train_block, "new_tokens": p.new_tokens,
                     "training_throughput": "global micro-batch x grad accumulation x block x steps / seconds",
                     "generation_throughput": "batch x new tokens / seconds"},
        "training": {"parallel": args.parallel, "world_size": world, "block_size": p.train_block,
                     "steps_per_repeat": args.train_steps, "repeats": args.repeats, "dataset": args.train_dataset,
                     "threads_per_rank": args.threads or "torch default",
                     "per_rank_peak_memory_bytes": {str(b): figure["peak_memory_bytes_per_rank"]
                                                    for b, figure in training.items() if figure},
                     "topology": measured_training[0]["topology"] if measured_training else None,
                     "commands": {str(b): figure["command"] for b, figure in training.items() if figure},
                     "architecture_only": session.meta.kind == "int8"},
        "environment": {**asdict(environment(session.device)), "world_size": world},
        "settings": session.settings,
        "measurements": progress.measurements,
    }
    score["timestamp"] = score["environment"]["date"]
    return score


def scorecard(args: LeaderboardConfig) -> dict:
    """Every figure the run wants, each written to --out as it is measured; a failed training run or a stop keeps
    the figures measured before it there, and says so."""
    with Heartbeat("scorecard") as beat:
        session, model, tokens = start(args, beat)
        kept_at = f"the figures measured so far are in {args.out} (`--resume` measures the rest)" if args.out else \
            "give --out to keep the figures a run measures"
        try:
            measure(session, model, tokens, beat)
        except TrainingFailed as e:
            figure = training_key(e.batch)
            session.progress.failed(figure, e.cause)
            session.progress.status[figure]["output_tail"] = e.output_tail.splitlines()[-20:]
            session.progress.stopped(f"{figure} failed first")
            score = session.save()
            if not args.out:  # the only place the figures measured before it can go
                print(json.dumps(score, indent=2))
            raise LeaderboardError(f"train.py failed for micro-batch {e.batch}: {e.cause}; {kept_at}") from None
        except KeyboardInterrupt as e:
            if not session.progress.measurements:
                raise Stopped.of(e).saying("before the scorecard measured a figure; nothing was written") from None
            session.progress.stopped("the run was stopped first")
            if args.out:
                session.save()
            raise Stopped.of(e).saying(f"before the scorecard was complete; {kept_at}") from None
        return session.save()
