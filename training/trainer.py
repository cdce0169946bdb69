"""The training loop: it reads like a table of contents and hands off to the step (training/step.py),
the checkpointer (training/checkpoint/), the evaluator and the metrics log (training/metrics.py)."""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator, NoReturn

import torch

from data.corpus import get_corpus
from data.corpus_types import Corpus
from data.loader import WindowSampler, eval_batches
from data.token_files import load_split, prepare_split
from model.config import GPTConfig, preset
from training.evaluate import evaluate_loss
from model.deferred_init import empty_model, seeded_parameters
from model.gpt import GPT, CausalSelfAttention
from training.optim import build_optimizer, lr_at, scaled_lr
from parallel import CommsMeter, check_divisibility, parallelize
from parallel.distributed import launched_by_torchrun, run_on_node_leader
from parallel.materialize import builds_on_meta
from parallel.local_state import local_state_bytes
from runtime.cli import non_default_fields
from runtime.device import is_out_of_memory, precision_policy
from runtime.progress import ProgressBar
from training.checkpoint import Checkpointer, load_init_model
from training.config import TrainConfig, TrainingError
from training.estimate import RunEstimate
from training.preset_defaults import describe_lr
from training.metrics import (NO_CLOCK, EvalRecord, MetricsLog, NullLog, PhaseClock, device_peak_flops,
                              flops_per_token, parallel_record, peak_memory_per_rank, step_record)
from training.step import NonFiniteStep, TrainStep
from training.stop_grace import stop_grace
from training.stop_points import ARM_SHARE, StopPoints
from training.stop_signals import StopRequested, StopSignals

# The tokens of the forward that proves a state savable (check_savable): enough to meet every weight.
PROBE_TOKENS = 64


def build_model(cfg: TrainConfig, checkpointer: Checkpointer, on_meta: bool = False) -> GPT:
    """Random weights from the preset and seed; or, with this run's dropout, the weights a resumed run saved
    (read once, into the one model built) or those of --init-from.  `on_meta`: random weights deferred, the model
    built on the meta device, for `materialize` to fill with the same seeded values once it is laid out."""
    if on_meta:
        return empty_model(preset(cfg.model, dropout=cfg.dropout))
    if checkpointer.resuming:
        model = checkpointer.saved_model()
    elif cfg.init_from:  # the writer rank loaded it when it claimed the folder; the others load their own
        model = checkpointer.init_model if checkpointer.init_model is not None else load_init_model(cfg)
    else:
        torch.manual_seed(cfg.seed)
        return GPT(preset(cfg.model, dropout=cfg.dropout))
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = cfg.dropout
        elif isinstance(module, CausalSelfAttention):  # the attention weights' dropout is a number, not a module
            module.dropout = cfg.dropout
    model.config.dropout = cfg.dropout
    return model


def tokenized_corpus(dataset: str, ctx) -> Corpus:
    """The corpus `dataset` names, resolved once on this rank, with its training and validation splits tokenized.
    One rank per node resolves and tokenizes first; the node's other ranks then resolve it from the caches it
    filled (resolving a hub repository downloads it) and find the token files written."""
    def resolve_and_tokenize() -> Corpus:
        corpus = get_corpus(dataset)
        for split in ("train", "validation"):
            prepare_split(corpus, split)
        return corpus
    corpus = run_on_node_leader(ctx, resolve_and_tokenize, f"tokenize {dataset}")
    return get_corpus(dataset) if corpus is None else corpus


def training_block(cfg: TrainConfig, model_config: GPTConfig) -> int:
    block = cfg.block_size or model_config.block_size
    if block > model_config.block_size:
        raise TrainingError(f"--block-size {block} is larger than the model's context of "
                            f"{model_config.block_size}; use --block-size <= {model_config.block_size}")
    return block


class Trainer:
    """One run, built from its config: the model parallelised, the data, the optimizer, the step, the
    checkpointer and the metrics log; `fit` trains it."""

    def __init__(self, cfg: TrainConfig, ctx, strategy_class, given: set[str] | None = None):
        """`ctx` and `strategy_class`: the layout train.py derived from --parallel and --tp-size.  `given`: the
        settings the command line named (a resumed run keeps its own for the rest); by default those that
        differ from the defaults.  The run folder is claimed here and released by `close` (or leaving a
        `with` block), also when building the run fails."""
        self.ctx, self.device, self.out_dir = ctx, ctx.device, Path(cfg.out_dir)
        self.strategy_class = strategy_class
        self.say = print if ctx.is_writer else (lambda *a, **k: None)
        self.checkpointer = Checkpointer(self.out_dir, ctx)
        try:
            # A config built in code has no command line: the settings that differ from the defaults count as given.
            self.build(cfg, set(non_default_fields(cfg)) if given is None else given)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.checkpointer.close()

    def build(self, cfg: TrainConfig, given: set[str]) -> None:
        ctx = self.ctx
        cfg, changes = self.checkpointer.open(cfg, given)
        resuming = self.checkpointer.resuming
        if changes:
            self.say(f"resume: {'; '.join(changes)}")
        if not resuming:  # a resumed run keeps its saved settings, which its first run said
            self.say(describe_lr(cfg.lr, cfg.model, cfg.init_from), flush=True)
        self.cfg = cfg
        self.precision = precision_policy(self.device, cfg.precision)
        # A new run with random weights under a sharding layout is built on the meta device, and each rank
        # materialises only its shards of the seeded weights after parallelize (parallel/materialize.py).
        on_meta = not resuming and not cfg.init_from and builds_on_meta(ctx, self.strategy_class)
        model = build_model(cfg, self.checkpointer, on_meta)
        self.model_config, self.block = model.config, training_block(cfg, model.config)
        check_divisibility(self.model_config, ctx)
        if not on_meta:
            model.to(self.device)
        model.gradient_checkpointing = cfg.activation_checkpointing
        # Counted before parallelize: afterwards a tensor-parallel rank holds a shard of the parameters.
        self.n_params, self.n_params_padded = model.num_parameters(padded_vocab=False), model.num_parameters()
        self.meter = CommsMeter()
        self.par = parallelize(model, ctx, self.strategy_class, self.meter, param_dtype=self.precision.autocast_dtype,
                               cpu_offload=cfg.cpu_offload,
                               values=seeded_parameters(self.model_config, cfg.seed) if on_meta else None)
        self.model = model
        if self.par.note:
            self.say(f"note: {self.par.note}")
        corpus = tokenized_corpus(cfg.dataset, ctx)
        self.train_tokens = load_split(corpus, "train")
        self.val_tokens = load_split(corpus, "validation")
        self.sampler = WindowSampler(self.train_tokens, self.block, cfg.batch_size, seed=cfg.seed,
                                     dp_rank=ctx.dp_rank, dp_size=ctx.dp_size)
        self.optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)
        self.max_lr = scaled_lr(cfg.lr, self.sampler.global_batch, cfg.reference_batch or cfg.batch_size,
                                cfg.scale_lr)
        self.checkpointer.register(self.par, self.model_config, self.optimizer, self.sampler)
        self.start_step = self.checkpointer.load()
        if resuming:
            self.say(f"resumed {self.out_dir} at step {self.start_step}")
        module = torch.compile(self.par.module) if cfg.compile else self.par.module
        self.eval_module = self.par.eval_module if self.par.is_distributed else module
        self.step = TrainStep(module, self.optimizer, self.par.strategy, self.device, self.precision, cfg.grad_accum,
                              cfg.grad_clip)
        self.step.steps_taken = self.start_step
        self.tokens_per_step = self.sampler.global_batch * cfg.grad_accum * self.block
        self.peak_flops = device_peak_flops(self.device, cfg.peak_flops)
        self.flops_per_token = flops_per_token(self.model_config, self.n_params, self.block)
        self.grace = stop_grace(cfg.stop_grace_s, launched_by_torchrun())
        self.metrics = (MetricsLog(self.out_dir, cfg.tensorboard, self.start_step if resuming else None, cfg.curves)
                        if ctx.is_writer else NullLog())
        self.announce()

    def announce(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        self.say(f"model {cfg.init_from or cfg.model}: {self.n_params:,} parameters "
                 f"({self.n_params_padded:,} with the vocabulary padded to {self.model_config.padded_vocab_size}); "
                 f"device {self.device}, precision {self.precision.autocast_dtype or torch.float32}, "
                 f"{len(self.train_tokens):,} training tokens, {self.tokens_per_step:,} tokens per step")
        if self.par.is_distributed:
            self.say(f"parallel {cfg.parallel}: {ctx.world_size} ranks ({ctx.nodes} node{'s' if ctx.nodes > 1 else ''}"
                     f" x {ctx.procs_per_node}, {ctx.backend}), dp {ctx.dp_size} x tp {ctx.tp_size}, "
                     f"global batch {self.sampler.global_batch} ({cfg.batch_size} per dp rank), "
                     f"peak lr {self.max_lr:.2e}")

    def fit(self) -> EvalRecord:
        """Train to --max-steps, checkpointing and validating on the way; returns the final validation."""
        cfg = self.cfg
        self.completed = self.start_step  # steps whose update is applied: the count the console and records use
        self.finishing_step = False  # whether the step under way is in its last micro-batch (see on_stop_signal)
        self.micro_batch_s: float | None = None  # the slowest rank's last micro-batch, as the ranks agreed on it
        self.micro_batch_started, self.last_micro_batch_s = time.perf_counter(), 0.0
        self.last_checkpoint_at = time.monotonic()  # for --checkpoint-minutes
        self.last_save_s: float | None = None  # the last save's probe and write, all ranks together
        self.estimate = RunEstimate(cfg.max_steps - self.start_step, cfg.grad_accum, self.device)
        try:
            with StopSignals(self.ctx, self.on_stop_signal) as stop_signals:
                self.stop_points = self.install_stop_points(stop_signals)
                try:
                    self.train_steps(stop_signals)
                    return self.evaluate(cfg.max_steps, cfg.final_eval_batches, stop_signals)
                except StopRequested as e:
                    stop = e
                    # Saved after this handler, whose traceback would keep the abandoned micro-batch's activations
                    # (gigabytes at GPT-2 Medium) alive through the save; and while the signal handlers still listen,
                    # so that a second Ctrl-C interrupts the save (the staged files are discarded) and ends below.
                    stop.__traceback__ = None
                finally:
                    if self.stop_points is not None:
                        self.stop_points.remove()
                self.save_and_exit(stop, stop_signals)
        except KeyboardInterrupt:
            print(f"\ninterrupted after step {self.completed}; {self.checkpointer.describe_last_good()} "
                  f"(continue with --resume)", file=sys.stderr)
            raise SystemExit(130)
        except NonFiniteStep as e:
            last_good = self.checkpointer.describe_last_good()
            raise TrainingError(f"{e}; stopping. {last_good[:1].upper()}{last_good[1:]}. Try a lower --lr or "
                                f"--grad-clip, or fp32 precision.") from e
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not is_out_of_memory(e):
                raise
            raise TrainingError(f"batch {cfg.batch_size} x block {self.block} does not fit in {self.device} memory; "
                                f"lower --batch-size (and raise --grad-accum to keep the batch) or use "
                                f"--activation-checkpointing") from e

    def install_stop_points(self, stop_signals: StopSignals) -> StopPoints | None:
        """The agreement points inside a micro-batch (training/stop_points.py), where the blocks run uncompiled in
        the thread that runs the step (the strategy says whether they do)."""
        if self.cfg.compile or not self.par.strategy.blocks_run_in_calling_thread:
            return None
        return StopPoints(self.model.transformer.h, lambda: stop_signals.check(finishing=self.finishing_step))

    def points_armed(self) -> bool:
        """Whether the next micro-batch stops at its blocks: always in one process; under a launcher, while the
        slowest rank's micro-batch takes ARM_SHARE of the grace or more, and before one has been timed."""
        return (self.stop_points is not None and
                (self.ctx.world_size == 1 or self.micro_batch_s is None or
                 self.micro_batch_s >= ARM_SHARE * self.grace.seconds))

    def save_and_exit(self, stop: StopRequested, stop_signals: StopSignals) -> NoReturn:
        """Save the last whole step, unless a save of this run took longer than the grace left (the launcher's SIGKILL
        would cut it short, and the time is better left to the exit), and say so in one line."""
        grace_left = self.grace.seconds - (time.monotonic() - stop.received_at)
        too_long = (self.completed != self.checkpointer.last_saved_step and self.last_save_s is not None
                    and self.last_save_s > grace_left)
        (too_long,) = stop_signals.agree(float(too_long))[2]  # a save is collective: every rank takes it or none
        saved = not too_long and self.save_if_due(self.completed, last=True)
        grace_left = self.grace.seconds - (time.monotonic() - stop.received_at)
        if self.ctx.is_writer:  # one line for the job, not one per rank
            timing = (f", saved in {self.last_save_s:.1f} s with {max(0.0, grace_left):.0f} s of the "
                      f"{self.grace.seconds:g} s grace to spare" if saved else "")
            skipped = (f" not saved: a save of this run takes {self.last_save_s:.0f} s, longer than the "
                       f"{max(0.0, grace_left):.0f} s left of the {self.grace.seconds:g} s grace ({self.grace.source}; "
                       f"--checkpoint-minutes bounds what such a stop loses);" if too_long else "")
            print(f"stopped by {stop} after step {self.completed};{skipped} "
                  f"{self.checkpointer.describe_last_good()}{timing} (continue with --resume); exit status "
                  f"{stop.exit_status}", file=sys.stderr)
        raise SystemExit(stop.exit_status)

    def on_stop_signal(self, signal_name: str) -> bool:
        """Said by the signal handler the moment the first stop signal arrives: what happens and which step is saved.
        Returns whether the step under way finishes: only once its last micro-batch is under way, and then, if that
        micro-batch can be abandoned at its blocks, only if its expected end and a save fit well within the grace."""
        armed = self.stop_points is not None and self.stop_points.armed
        finish = self.finishing_step and (not armed or self.finish_fits_in_grace())
        if self.ctx.is_writer:
            where = "within" if armed and not finish else "after"
            kept = self.completed + finish
            saving = (f"step {kept} is on disk already" if kept == self.checkpointer.last_saved_step
                      else f"not saving (a save of this run takes {self.last_save_s:.0f} s)"
                      if self.last_save_s is not None and self.last_save_s > self.grace.seconds
                      else f"saving step {kept}")
            print(f"{signal_name}: stopping {where} this micro-batch; {saving} (the grace before a SIGKILL: "
                  f"{self.grace.seconds:g} s, {self.grace.source})", file=sys.stderr, flush=True)
        return finish

    def finish_fits_in_grace(self) -> bool:
        """Whether the rest of the micro-batch under way and a save take at most half the grace (the other half for a
        busy host).  Until this run has saved once, a quarter of the grace is set aside for the save."""
        if self.micro_batch_s is None:  # the run's first micro-batch: its length is not known
            return False
        left = max(0.0, self.micro_batch_s - (time.perf_counter() - self.micro_batch_started))
        save_s = self.last_save_s
        return left + (self.grace.seconds / 4 if save_s is None else save_s) <= self.grace.seconds / 2

    def train_steps(self, stop_signals: StopSignals) -> None:
        """The steps from the start (or the resumed) step to --max-steps; at every agreement point (after each
        micro-batch, and at the blocks while they are armed), a stop signal on any rank stops every rank, and a
        step stopped midway is dropped (training/stop_signals.py)."""
        cfg = self.cfg
        window_start, window_steps, excluded = time.perf_counter(), 0, 0.0
        for step in range(self.start_step, cfg.max_steps):
            done = step + 1
            logged = done % cfg.log_interval == 0 or done == cfg.max_steps
            clock = PhaseClock(self.device) if logged else NO_CLOCK  # synchronising costs GPU throughput
            lr = lr_at(step, self.max_lr, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)
            started = time.perf_counter()
            position = self.sampler.state_dict(), torch.get_rng_state(), self.device_rng_state()
            self.finishing_step = cfg.grad_accum == 1
            self.micro_batch_started = started
            self.arm_stop_points(self.points_armed())
            try:
                result = self.step(self.sampler.next_batch, lr, clock, self.after_micro_batch(stop_signals, started))
            except StopRequested:  # back to the state of the last whole step, which is what gets saved
                self.sampler.load_state_dict(position[0])
                torch.set_rng_state(position[1])
                if position[2] is not None:
                    torch.cuda.set_rng_state(position[2], self.device)
                raise
            finally:
                self.arm_stop_points(False)  # the evaluations and the save's probe run the blocks too
            self.estimate.step_done(time.perf_counter() - started)
            self.completed, self.finishing_step = done, False
            window_steps += 1
            if logged:
                clock.seconds["other"] = max(0.0, time.perf_counter() - started - sum(clock.seconds.values()))
                self.log_step(done, lr, result, clock, time.perf_counter() - window_start - excluded, window_steps)
                window_start, window_steps, excluded = time.perf_counter(), 0, 0.0
            t0 = time.perf_counter()  # evaluation and checkpointing are kept out of tokens/s
            if done % cfg.eval_interval == 0 and done != cfg.max_steps:
                self.evaluate(done, cfg.eval_batches, stop_signals)
            # One agreement: a stop (which saves this step itself), the slowest micro-batch, and whether any rank's
            # clock says --checkpoint-minutes have passed (a save is collective: every rank must take it).
            self.micro_batch_s, clock_due = stop_signals.check(self.last_micro_batch_s, self.checkpoint_clock_due())
            self.save_if_due(done, last=done == cfg.max_steps or self.anchors_stops(step),
                             by_clock=bool(clock_due))
            excluded += time.perf_counter() - t0

    def anchors_stops(self, step: int) -> bool:
        """Whether the first step this process trains is saved at once: when its micro-batch took half the stop's
        grace or more.  A stop then cannot wait for a micro-batch to end, and a consolidated save may itself outlast
        what is left of the grace (at GPT-2 Medium on four CPU ranks on a busy 2-core host: `python -m
        bench.drills.stop_beyond_grace`, bench/results/stop_beyond_grace.json), so a
        stop finds this step on disk, and the save's time tells later stops whether saving fits the grace."""
        return (step == self.start_step and self.micro_batch_s is not None
                and self.micro_batch_s >= self.grace.seconds / 2)

    def arm_stop_points(self, armed: bool) -> None:
        if self.stop_points is not None:
            self.stop_points.armed = armed

    def checkpoint_clock_due(self) -> float:
        return float(time.monotonic() - self.last_checkpoint_at >= self.cfg.checkpoint_minutes * 60)

    def after_micro_batch(self, stop_signals: StopSignals, step_started: float):
        """What runs after each micro-batch: the run's first estimate, and the ranks' agreement on a stop signal and
        on the slowest micro-batch (not after the last micro-batch: the step then finishes, and the check after it
        stops)."""
        def hook(micro: int) -> None:
            took = time.perf_counter() - self.micro_batch_started
            if not self.estimate.announced:
                for line in self.estimate.first_micro_batch(time.perf_counter() - step_started):
                    self.say(line, flush=True)
            if micro < self.cfg.grad_accum - 1:
                (self.micro_batch_s,) = stop_signals.check(took)
                self.finishing_step = micro == self.cfg.grad_accum - 2  # the last one is next: no check after it
                self.arm_stop_points(self.points_armed())
            self.last_micro_batch_s = took
            self.micro_batch_started = time.perf_counter()
        return hook

    def device_rng_state(self) -> torch.Tensor | None:
        return torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None

    def save_if_due(self, step: int, last: bool = False, by_clock: bool = False) -> bool:
        """The checkpoint of `step` when the checkpointer says one is due, once its state proves savable; returns
        whether it was saved."""
        if not self.checkpointer.due(step, last, by_clock):
            return False
        started = time.perf_counter()
        self.check_savable(step)
        self.checkpointer.save(step)
        self.last_save_s = time.perf_counter() - started
        self.last_checkpoint_at = time.monotonic()
        self.say(f"step {step}: checkpoint saved in {self.last_save_s:.1f} s", flush=True)
        return True

    def check_savable(self, step: int) -> None:
        """Only weights that still give a finite loss are saved: a finite but exploded update (a huge
        --lr) would otherwise become "the last good checkpoint" and only fail at the next step.  One row of
        PROBE_TOKENS is enough to see a non-finite loss, and a full batch's forward would take a stop's grace at
        GPT-2 Medium (most of torchrun's default grace on a busy 2-core host: bench/by_hand.md)."""
        with self.meter.paused():
            first_batch = eval_batches(self.val_tokens, min(self.block, PROBE_TOKENS), 1, 1)
            probe = evaluate_loss(self.eval_module, first_batch, self.device, self.precision.autocast)["val_loss"]
            self.par.strategy.after_evaluation()
            if not math.isfinite(probe):
                raise NonFiniteStep(probe, float("nan"), f"validation loss became {probe} after the update of "
                                                         f"step {step}, so that state is not saved")

    def evaluate(self, step: int, max_batches: int | None, stop_signals: StopSignals) -> EvalRecord:
        """Validation loss over `max_batches` batches (None: the whole split); a stop signal abandons it between
        batches, as a scheduler's SIGKILL can follow its SIGTERM sooner than a long validation ends."""
        t0 = time.perf_counter()
        # The windows of `max_batches` global batches, fed a rank's batch at a time: every rank runs the
        # whole evaluation (FSDP needs them in step), so a global batch at once would multiply each rank's
        # logits by the number of data-parallel ranks.
        windows = None if max_batches is None else max_batches * self.ctx.dp_size
        with self.meter.paused():
            batches = eval_batches(self.val_tokens, self.block, self.cfg.batch_size, windows)
            if max_batches is None and self.ctx.is_writer:  # the whole split can take minutes: show it
                windows_in_split = -(-(len(self.val_tokens) - 1) // self.block)
                batches = ProgressBar(batches, total=-(-windows_in_split // self.cfg.batch_size), unit="batch",
                                      desc=f"validation, whole split ({len(self.val_tokens):,} tokens)")
            try:
                result = evaluate_loss(self.eval_module, self.until_stopped(batches, stop_signals), self.device,
                                       self.precision.autocast)
            finally:
                if isinstance(batches, ProgressBar):  # the bar's line ends before a stop's message
                    batches.close()
            self.par.strategy.after_evaluation()
        record = EvalRecord(step, step * self.tokens_per_step, **result, eval_full_split=max_batches is None,
                            eval_s=time.perf_counter() - t0, peak_memory_bytes_per_rank=peak_memory_per_rank(self.ctx))
        self.metrics.write(record)
        self.say(f"step {step}: val_loss {record.val_loss:.4f} (ppl {record.val_ppl:.1f}, "
                 f"{record.val_tokens:,} tokens{', whole split' if max_batches is None else ''})")
        return record

    def until_stopped(self, batches: Iterable, stop_signals: StopSignals) -> Iterator:
        """`batches`, with every rank's stop check before each (all ranks run the whole evaluation in step)."""
        for batch in batches:
            stop_signals.check()
            yield batch

    def log_step(self, done: int, lr: float, result, clock: PhaseClock, elapsed: float, steps: int) -> None:
        parallel = None
        if self.par.is_distributed:
            cfg, strategy = self.cfg, self.par.strategy
            activation_bytes = (self.precision.autocast_dtype or torch.float32).itemsize
            parallel = parallel_record(
                self.meter.snapshot(), elapsed, steps, self.ctx,
                theory=strategy.theoretical_bytes(cfg.batch_size, self.block, cfg.grad_accum, activation_bytes),
                comm_is_exposed_wait=strategy.comm_time_is_exposed_wait,
                peaks=peak_memory_per_rank(self.ctx), state_bytes=local_state_bytes(self.model, self.optimizer))
        record = step_record(done, lr, result, clock, elapsed, steps, self.tokens_per_step, self.ctx.world_size,
                             self.flops_per_token, self.peak_flops, self.device, parallel)
        self.metrics.write(record)
        self.meter.reset()
        mfu = f", MFU {record.mfu:.1%}" if record.mfu is not None else ""
        comm = f", comm {record.parallel.comm_share:.0%}" if record.parallel else ""
        left = self.cfg.max_steps - done
        self.say(f"step {done}/{self.cfg.max_steps}: loss {result.loss:.4f}, lr {lr:.2e}, "
                 f"{record.tokens_per_s:,.0f} tokens/s{mfu}{comm}"
                 + (f", {self.estimate.left(left)} left" if left else ""))
