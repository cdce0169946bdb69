"""Prune a trained GPT-2 in rounds, fine-tuning after each, and measure what it costs and what it buys.

    python prune/iterative.py --target 0.8                      # magnitude pruning of the newest train.py checkpoint
    python prune/iterative.py --target 0.5 --method row         # remove heads and MLP units: a smaller, faster model
    python prune/iterative.py --target 0.5 --method wanda --finetune-steps 0
    python prune/iterative.py --target 0.8 --method magnitude,row  # both, one report with both curves

Methods: `magnitude` (global unstructured, smallest |w| first), `row` (whole MLP hidden units
and attention heads removed per layer, layers rebuilt smaller), `wanda` (|w| x input-activation
norm, per output row).  Each round cuts to the next sparsity of the schedule, evaluates, fine-tunes
with the masks enforced, evaluates again, times the model against the dense one in the same run,
and saves the checkpoint, `prune_report.json` and the plots to --out-dir atomically, so Ctrl-C
leaves the last finished round intact.  Several methods run into one --out-dir accumulate in the
report (one curve each); the checkpoint there is the latest run's.
"""
from __future__ import annotations

if __name__ == "__main__":  # first: a stop sent while the imports below take seconds is noted (runtime/stopping.py)
    from runtime.stopping import note_stops_while_starting
    note_stops_while_starting()

import copy
import dataclasses
import time
from pathlib import Path

import torch

from data.loader import WindowSampler, eval_batches
from data.token_files import load_split
from training.evaluate import evaluate_loss
from model.gpt import GPT
from prune.config import PruneConfig, method_names, validate_against_model
from prune.finetune import FinetuneSettings, finetune
from prune.masks import MaskSet
from prune.methods import METHODS, MaskedMethod, PruningMethod, ScoringInputs
from prune.report import read_report, report_writers, round_row, round_summary, sparsity_counts
from prune.schedule import sparsity_schedule
from prune.source import resolve_dataset
from prune.speed import SpeedSettings, judge_round, read_ratio, sparse_format_verdict, speed_against_dense
from runtime.cli import entry_point, parse_config
from runtime.device import choose_device, precision_policy
from runtime.progress import Heartbeat, ProgressBar, duration
from runtime.provenance import provenance
from runtime.stopping import Stopped
from storage.artifact import artifact_writers, load_model, model_state_for_saving, write_folder_atomically
from storage.claim import claim_output_folder
from storage.meta import ArtifactMeta
from storage.run_folder import pick_checkpoint


def load_source(cfg: PruneConfig, device) -> tuple[GPT, Path, ArtifactMeta]:
    """The model to prune, loaded and announced, with its folder and stored metadata."""
    folder, found = pick_checkpoint(cfg.checkpoint)
    model, meta = load_model(folder, device, kinds=("float", "pruned"), why="pruning needs a floating-point model")
    claim_output_folder(cfg.out_dir, "prune/iterative.py", cfg.overwrite, source=folder, out_flag="--out-dir")
    config = model.config
    print(f"loaded {meta.kind} checkpoint {folder} ({found}"
          f"{', step ' + str(meta.step) if meta.step is not None else ''}): {config.n_layer} layers, "
          f"{config.n_head} heads, n_embd {config.n_embd}, {model.num_parameters(padded_vocab=False):,} parameters")
    return model.eval(), folder, meta


class PruningRun:
    """The fixed parts of one run (data, dense baseline, original sizes) and the steps of a round."""

    def __init__(self, cfg: PruneConfig, method: PruningMethod, model: GPT, folder: Path, dataset: str, block: int,
                 device, precision):
        self.cfg, self.method, self.folder, self.dataset, self.block = cfg, method, folder, dataset, block
        self.device, self.precision = device, precision
        self.out_dir = Path(cfg.out_dir)
        self.train_tokens = load_split(dataset, "train")
        self.sampler = WindowSampler(self.train_tokens, block, cfg.batch_size, seed=cfg.seed)
        self.val_batches = list(eval_batches(load_split(dataset, "validation"), block, cfg.batch_size,
                                             cfg.eval_batches))
        calibration = None
        if method.needs_calibration:
            calibration_sampler = WindowSampler(self.train_tokens, block, cfg.batch_size, seed=cfg.seed + 1)
            calibration = [calibration_sampler.next_batch() for _ in range(cfg.calibration_batches)]
        self.scoring = ScoringInputs(model.config, calibration, device)
        self.settings = FinetuneSettings(cfg.finetune_steps, cfg.lr, cfg.weight_decay, cfg.warmup_steps)
        self.speed = SpeedSettings(cfg.speed_batch, cfg.speed_seq_len, cfg.generation_tokens, cfg.speed_repeats)
        self.dense = copy.deepcopy(model).eval()  # the baseline every round is timed against
        self.twin = copy.deepcopy(model).eval()  # timed beside it every round: that round's noise floor
        self.pruned_total = sum(t.numel() for t in method.pruned_tensors(model))
        self.all_total = sum(p.numel() for p in model.parameters())
        self.saved_round = 0  # the round whose checkpoint --out-dir holds (0: none of this run)
        self.beat: Heartbeat | None = None  # the run's estimate and its lines while it works (`run` sets it)
        self.started = time.perf_counter()
        self.round_seconds: list[float] = []

    def doing(self, what: str) -> None:
        if self.beat is not None:
            self.beat.phase(what)

    def estimate_from_first_step(self, k: int, step_s: float, round_start: float, baseline: dict) -> None:
        """Round 1's first fine-tune step is the last unit of work not yet timed: a round is pruning, two
        evaluations, the fine-tune steps and the speed check, each timed once by now (round 0's check timed two
        models, a round's times three: dense, its copy and the pruned model, and a fourth with the CSR check)."""
        if k != 1 or self.beat is None:
            return
        timed = baseline["time_s"]
        models = 4 if self.cfg.sparse_format_check and isinstance(self.method, MaskedMethod) else 3
        round_s = (time.perf_counter() - round_start) + timed["eval"] + step_s * (self.cfg.finetune_steps - 1) \
            + timed["speed"] * models / 2
        left = round_s * self.cfg.rounds - (time.perf_counter() - round_start)
        self.beat.expect(left, f"estimate: about {duration(round_s)} per round (first fine-tune step "
                               f"{duration(step_s)}), about {duration(time.perf_counter() - self.started + left)} for "
                               f"the whole run, {duration(left)} to go")

    def round_done(self, k: int, seconds: float) -> None:
        self.round_seconds.append(seconds)
        if self.beat is None:
            return
        per_round = sum(self.round_seconds) / len(self.round_seconds)
        left = per_round * (self.cfg.rounds - k)
        said = None
        if k == 1 and not self.cfg.finetune_steps:  # no fine-tune step gave an estimate earlier
            said = (f"estimate: round 1 took {duration(seconds)}, about "
                    f"{duration(time.perf_counter() - self.started + left)} for the whole run, {duration(left)} to go")
        self.beat.expect(left, said)

    def evaluate(self, model: GPT) -> float:
        return evaluate_loss(model, self.val_batches, self.device, self.precision.autocast)["val_loss"]

    def counts(self, model: GPT) -> dict:
        return sparsity_counts(model, self.method.pruned_tensors(model), self.pruned_total, self.all_total)

    def baseline(self, model: GPT) -> dict:
        """Round 0: the dense model's loss, and its speed against a copy of itself (as every round's noise floor)."""
        start = time.perf_counter()
        self.doing("dense baseline: validation")
        row = round_row(0, 0.0, None, self.evaluate(model), 0, self.counts(model))
        evaluated = time.perf_counter()
        self.doing("dense baseline: the dense model timed against a copy of itself (the noise floor)")
        row.update(speed_against_dense(self.dense, self.twin, None, self.speed, self.device, with_csr=False))
        end = time.perf_counter()
        row["time_s"] = {"eval": evaluated - start, "speed": end - evaluated, "total": end - start}
        return row

    def describe(self, schedule: list[float]) -> dict:
        cfg = self.cfg
        return {"method": cfg.method, "target": cfg.target, "schedule": cfg.schedule, "schedule_sparsities": schedule,
                "rounds_planned": cfg.rounds, "finetune_steps": cfg.finetune_steps, "lr": cfg.lr,
                "weight_decay": cfg.weight_decay, "batch_size": cfg.batch_size, "block_size": self.block,
                "prune_params": self.method.describe(),
                "source_checkpoint": str(self.folder), "dataset": self.dataset, "device": str(self.device),
                "precision": str(self.precision.autocast_dtype or torch.float32),
                "eval": {"split": "validation", "batches": len(self.val_batches), "batch_size": cfg.batch_size,
                         "block_size": self.block},
                "speed_settings": {**dataclasses.asdict(self.speed), "torch_threads": torch.get_num_threads(),
                                   "method": "median of repeats after one warm-up; dense, a copy of dense and pruned "
                                             "interleaved in every round: the copy against dense is that round's "
                                             "noise floor, and a ratio whose dense rate moved beyond it since the "
                                             "previous round is marked not measurable"},
                "finished": False}

    def dense_control(self) -> dict:
        """The unpruned model fine-tuned on the same batches for as many steps as the whole pruning run."""
        control = copy.deepcopy(self.dense)
        steps = self.cfg.rounds * self.cfg.finetune_steps
        start = time.perf_counter()
        finetune(control, WindowSampler(self.train_tokens, self.block, self.cfg.batch_size, seed=self.cfg.seed),
                 dataclasses.replace(self.settings, steps=steps), self.device, self.precision,
                 desc="dense control fine-tune")
        return {"finetune_steps": steps, "val_loss": self.evaluate(control), "time_s": time.perf_counter() - start}

    def round(self, k: int, sparsity: float, model: GPT, masks: MaskSet | None,
              baseline: dict) -> tuple[GPT, MaskSet | None, dict]:
        """Prune to `sparsity`, evaluate, fine-tune, evaluate, time: the new model, its masks and the report row."""
        cfg = self.cfg
        t0 = time.perf_counter()
        self.doing(f"round {k}/{cfg.rounds}: pruning to {sparsity:.1%}")
        model, masks = self.method.apply(model, self.method.score(model, sparsity, masks, self.scoring))
        t1 = time.perf_counter()
        self.doing(f"round {k}/{cfg.rounds}: validation after pruning")
        loss_after_pruning = self.evaluate(model)
        t2 = time.perf_counter()
        self.doing(f"round {k}/{cfg.rounds}: {cfg.finetune_steps} fine-tune steps")
        finetune(model, self.sampler, self.settings, self.device, self.precision, masks,
                 desc=f"round {k}/{cfg.rounds} fine-tune",
                 on_first_step=lambda seconds: self.estimate_from_first_step(k, seconds, t0, baseline))
        t3 = time.perf_counter()
        self.doing(f"round {k}/{cfg.rounds}: validation after fine-tuning")
        val_loss = self.evaluate(model) if cfg.finetune_steps else loss_after_pruning
        t4 = time.perf_counter()
        row = round_row(k, sparsity, loss_after_pruning, val_loss, cfg.finetune_steps, self.counts(model))
        row.update(self.method.round_details(model))
        self.doing(f"round {k}/{cfg.rounds}: speed against the dense model")
        row.update(speed_against_dense(self.dense, self.twin, model, self.speed, self.device,
                                       with_csr=masks is not None and cfg.sparse_format_check))
        t5 = time.perf_counter()
        row["time_s"] = {"prune": t1 - t0, "finetune": t3 - t2, "eval": (t2 - t1) + (t4 - t3), "speed": t5 - t4,
                         "total": t5 - t0}
        return model, masks, row

    def save(self, model: GPT, report: dict, row: dict) -> None:
        """The checkpoint, the report and the plots, all or nothing."""
        cfg = self.cfg
        pruning_meta = {"method": cfg.method, "round": row["round"], "rounds": cfg.rounds, "target": cfg.target,
                        "sparsity_pruned_tensors": row["sparsity_pruned_tensors"],
                        "sparsity_all_params": row["sparsity_all_params"], "dataset": self.dataset}
        writers = artifact_writers(model_state_for_saving(model), model.config, "pruned",
                                   provenance("prune/iterative.py", self.folder), extra={"pruning": pruning_meta})
        writers.update(report_writers(report))

        def in_place() -> None:  # recorded before a Ctrl-C held during the move is delivered
            self.saved_round = row["round"]
        write_folder_atomically(self.out_dir, writers, on_saved=in_place)


def run(cfg: PruneConfig) -> dict:
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    with Heartbeat(f"{cfg.method} pruning") as beat:
        device = choose_device(cfg.device)
        precision = precision_policy(device, cfg.precision)
        beat.phase("loading the model")
        model, folder, _ = load_source(cfg, device)
        method = METHODS[cfg.method](cfg.prune_params)
        block = validate_against_model(cfg, model, method)
        dataset = resolve_dataset(cfg.dataset, folder)
        out_dir = Path(cfg.out_dir)
        report = read_report(out_dir)
        for other, entry in report["methods"].items():
            if other != cfg.method and entry.get("source_checkpoint") != str(folder):
                print(f"note: {out_dir}/prune_report.json also holds a {other} run pruned from "
                      f"{entry.get('source_checkpoint')}, not {folder}; its curve stays in the plots")
        schedule = sparsity_schedule(cfg.target, cfg.rounds, cfg.schedule)
        beat.phase("reading the data")
        session = PruningRun(cfg, method, model, folder, dataset, block, device, precision)
        session.beat = beat
        entry = pruning_rounds(session, model, schedule, report)
    final, baseline = entry["rounds"][-1], entry["rounds"][0]
    print(f"wrote {out_dir}: pruned checkpoint (round {cfg.rounds}), prune_report.json, loss_vs_sparsity.png, "
          f"speed_vs_sparsity.png")
    print(f"dense val_loss {baseline['val_loss']:.4f} -> {final['val_loss']:.4f} at "
          f"{final['sparsity_pruned_tensors']:.2%} sparsity; measured against the dense model in the last round: "
          f"forward {read_ratio(final, 'forward')}, generation {read_ratio(final, 'generation')}"
          f"{'; the zeros are stored dense, so the model does the same work' if isinstance(method, MaskedMethod) else ''}")
    if entry.get("sparse_format"):
        print(entry["sparse_format"]["summary"])
    return report


def pruning_rounds(session: PruningRun, model: GPT, schedule: list[float], report: dict) -> dict:
    """The dense baseline (round 0), the dense control if asked, then each round, saved as it ends; the method's
    report entry."""
    cfg, beat, out_dir, block = session.cfg, session.beat, session.out_dir, session.block
    baseline = session.baseline(model)
    floor = baseline["noise_floor"]
    beat.say(f"dense: val_loss {baseline['val_loss']:.4f} on {len(session.val_batches)} batches of "
             f"{cfg.batch_size}x{block}, forward {baseline['forward_tokens_per_s']:,.0f} tokens/s, generation "
             f"{baseline['generation_tokens_per_s']:,.1f} tokens/s; noise floor now +-{floor:.0%} (the dense model timed "
             f"against a copy of itself: forward {baseline['forward_speedup']:.2f}x, generation "
             f"{baseline['generation_speedup']:.2f}x; every round measures its own beside its ratios)")
    entry = {**session.describe(schedule), "rounds": [baseline]}
    if cfg.dense_control and cfg.finetune_steps:
        session.doing(f"dense control: {cfg.rounds * cfg.finetune_steps} fine-tune steps without pruning")
        entry["dense_control"] = session.dense_control()
        beat.say(f"dense control: val_loss {entry['dense_control']['val_loss']:.4f} after "
                 f"{entry['dense_control']['finetune_steps']} fine-tune steps without pruning")

    masks = None
    rounds_bar = ProgressBar(total=cfg.rounds, desc=f"{cfg.method} pruning", unit="round")
    try:
        for k, sparsity in enumerate(schedule, start=1):
            started = time.perf_counter()
            model, masks, row = session.round(k, sparsity, model, masks, baseline)
            judge_round(entry["rounds"][-1], row)
            entry["rounds"].append(row)
            entry["finished"] = k == cfg.rounds
            entry["sparse_format"] = sparse_format_verdict(entry["rounds"], session.device)
            report["methods"][cfg.method] = entry
            report["checkpoint"] = {"method": cfg.method, "round": k, "target": cfg.target}
            session.doing(f"round {k}/{cfg.rounds}: saving")
            session.save(model, report, row)
            rounds_bar.update(1)
            beat.say(round_summary(row, cfg.rounds, stored_dense=isinstance(session.method, MaskedMethod)))
            session.round_done(k, time.perf_counter() - started)
    except KeyboardInterrupt as e:  # SIGINT or SIGTERM (runtime/stopping.py): the entry point prints the line
        rounds_bar.close()
        raise Stopped.of(e).saying(interrupted_rounds(session.saved_round, cfg.rounds, out_dir)) from None
    rounds_bar.close()
    return entry


def interrupted_rounds(saved: int, rounds: int, out_dir: Path) -> str:
    """What a stop during the rounds leaves: the round on disk, not the last one computed (a save the stop cut
    short was discarded)."""
    when = f"during round {saved + 1}" if saved < rounds else "after the last round"
    kept = (f"round {saved}'s checkpoint and report in {out_dir} are intact" if saved else
            f"no round had been saved, so {out_dir} holds nothing from this run")
    return f"{when}; {kept}"


# A stop during loading or the dense baseline; stops inside rounds say what they leave there.
@entry_point(interrupted="before a pruning round finished; nothing was written")
def main(argv=None) -> None:
    cfg = parse_config(PruneConfig, __doc__, argv)
    for method in method_names(cfg):  # each adds its curve to the same report in --out-dir
        run(dataclasses.replace(cfg, method=method))


if __name__ == "__main__":
    main()
