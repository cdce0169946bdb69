"""The training run's settings: one typed dataclass, filled from train.py's command line and saved into
every checkpoint (`training_state/state.json`), so a resumed run continues with the same settings."""
from __future__ import annotations

import math
from dataclasses import dataclass

from data.corpus import dataset_help
from model.config import PRESETS, GPTConfig
from parallel import MODES
from training.optim import LR_SCALING_RULES
from runtime.cli import check_options, flag, option
from runtime.errors import UserError
from training.preset_defaults import default_lr

DEFAULT_OUT_DIR = "out/train"
RESUME_MODES = ("no", "yes", "auto")


# What --init-from takes for "no checkpoint: random weights", the one way to unset a config file's init-from (TOML has
# no null).
RANDOM_WEIGHTS = ("", "none")


class TrainingError(UserError):
    """A problem with the arguments, the data or the run that the user can fix."""


@dataclass
class TrainConfig:
    model: str = option("tiny", "model preset", choices=tuple(PRESETS))
    dataset: str = option("builtin", dataset_help())
    skip_unreadable: bool = option(False, "go on without the files of a --dataset folder that cannot be read as text "
                                          "(other formats, broken links; each named in one line); without it they "
                                          "stop the run.  Read: .txt/.raw/.text, .jsonl, .parquet, each also "
                                          ".gz/.bz2/.xz/.zst")
    init_from: str | None = option(None, "start from this checkpoint or Hugging Face GPT-2 folder (fine-tuning) "
                                         "instead of random weights; none (or an empty value) trains --model from "
                                         "random weights, as leaving it out does, also where a --config file sets it "
                                         "(./none is a folder of that name)")
    max_steps: int = option(600, "optimizer steps in the whole run", min=1)
    batch_size: int = option(8, "micro-batch size per data-parallel rank", min=1)
    block_size: int | None = option(None, "training context length (default: the model's)", min=1)
    grad_accum: int = option(1, "micro-batches accumulated per optimizer step", min=1)
    lr: float | None = option(None, "peak learning rate (default: the preset's, from the GPT-3 paper's Table 2.1 for "
                                    "the GPT-2 sizes: gpt2 6e-4, gpt2-medium 3e-4, gpt2-large 2.5e-4, gpt2-xl 2e-4; "
                                    "1e-3 for tiny, small-cpu and --init-from; training/preset_defaults.py)",
                              above=0)
    min_lr_ratio: float = option(0.1, "cosine schedule decays to lr * this", min=0, max=1)
    warmup_steps: int = option(50, "steps of linear warmup", min=0)
    weight_decay: float = option(0.1, "AdamW weight decay of matrices (biases and LayerNorm gains do not decay)",
                                 min=0)
    grad_clip: float = option(1.0, "clip the global gradient norm to this", above=0)
    dropout: float = option(0.0, "dropout probability", min=0, below=1)
    seed: int = option(1337, "seed of the initial weights and the data order")
    device: str = option("auto", "auto (CUDA if present, else CPU), cpu, cuda, cuda:1, ...")
    precision: str = option("auto", "auto (fp32 on CPU, bf16/fp16 autocast on CUDA), fp32, bf16, fp16",
                            choices=("auto", "fp32", "bf16", "fp16"))
    compile: bool = option(False, "torch.compile the model")
    activation_checkpointing: bool = option(False, "recompute each block's activations in backward to save memory")
    out_dir: str = option(DEFAULT_OUT_DIR, "folder of the run: checkpoint, metrics.jsonl")
    resume: str = option("no", "continue the run in --out-dir from its checkpoint: `--resume` (or yes) requires "
                               "one; auto continues this run if the folder holds it and starts fresh in an empty "
                               "folder (for torchrun --max-restarts and requeued jobs)",
                         choices=RESUME_MODES, bare="yes")
    overwrite: bool = option(False, "start a new run in --out-dir even though it holds a run or another tool's "
                                    "artifact (whose files are removed first)")
    eval_interval: int = option(200, "validate (and checkpoint) every N steps; the final validation sweeps the "
                                     "whole split", min=1)
    eval_batches: int = option(20, "batches in the periodic validations (the same leading windows each time)", min=1)
    log_interval: int = option(10, "log a metrics line every N steps", min=1)
    checkpoint_interval: int | None = option(None, "checkpoint every N steps (default: --eval-interval)",
                                             min=1)
    # The default weighs what a SIGKILL (a node lost, a save longer than the grace) can lose against what saving
    # costs at GPT-2 Medium under torchrun x4 on the 2-core host, where a save (its probe's forward, then the weights
    # and AdamW state through fsync) cannot fit torchrun's grace: there the cadence, not the stop, keeps the run's
    # work.  The measured save and its share of the run's time are the report's, not the help's (figures age):
    # bench/REPORT.md, "Stopping GPT-2 Medium under torchrun".
    checkpoint_minutes: float = option(30.0, "also checkpoint when this many minutes have passed since the last "
                                             "checkpoint (or the start): the most a SIGKILL can lose.  The default "
                                             "weighs that against the time a GPT-2 Medium save takes, measured in "
                                             "bench/REPORT.md#stopping-gpt-2-medium-under-torchrun",
                                       above=0)
    parallel: str = option("none", "parallelism mode: none (one device); under torchrun ddp, fsdp, tp, allreduce, "
                                   "gather-scatter; dp (nn.DataParallel, one process over several CUDA devices)",
                           choices=tuple(MODES))
    tp_size: int = option(1, "tensor-parallel ranks per group; with ddp/fsdp, data parallelism runs over the "
                             "rest (2D)", min=1)
    cpu_offload: bool = option(False, "fsdp: keep sharded parameters, gradients and optimizer state in CPU memory")
    scale_lr: str = option("none", "scale --lr with the global batch relative to --reference-batch (linear or "
                                   "sqrt), after warmup", choices=LR_SCALING_RULES)
    reference_batch: int | None = option(None, "global batch (sequences) that --lr was tuned for (default: "
                                               "--batch-size, one rank)", min=1)
    stop_grace_s: float | None = option(None, "seconds between a stop signal and the SIGKILL that follows it (default: "
                                              "torchrun's --shutdown-timeout, read from its command line or "
                                              "environment; else 30, the usual schedulers' default): a micro-batch "
                                              "that would outlast it is abandoned to save the last whole step in time",
                                        above=0)
    dist_timeout_s: float = option(300.0, "collective timeout: if a rank dies or hangs, the others stop after "
                                          "this many seconds", above=0)
    final_eval_batches: int | None = option(None, "batches in the final validation (default: the whole split)",
                                             min=1)
    tensorboard: bool = option(False, "also write the metrics as TensorBoard event files under OUT/tb/ (needs the "
                                      "tensorboard package)")
    curves: bool = option(True, "redraw OUT/curves.png at every evaluation (about half a second each with "
                                "matplotlib; with --no-curves, `python -m bench.eval.plot_runs OUT` draws it later)")
    peak_flops: float | None = option(None, "one device's peak FLOP/s for MFU (default: a table of known GPUs; "
                                            "none on CPU)", above=0)

    def __post_init__(self):
        check_options(self, TrainingError)
        if self.init_from is not None and self.init_from.strip() in RANDOM_WEIGHTS:  # unsets a file's init-from
            self.init_from = None
        if self.lr is None and self.model in PRESETS:  # an unknown preset is refused below
            self.lr = default_lr(self.model, self.init_from).value
        for name in ("lr", "grad_clip", "dist_timeout_s", "weight_decay", "peak_flops", "checkpoint_minutes",
                     "stop_grace_s"):  # their bounds let infinity through
            value = getattr(self, name)
            self._require(name, value is None or math.isfinite(value), "must be a finite number")
        self._require("seed", 0 <= self.seed < 2**63, "must be a whole number from 0 to 2**63 - 1")
        self._require("out_dir", self.out_dir.strip() != "", "must name a folder (an empty name would train into "
                                                             "the current directory)")
        if self.resume != "no" and self.overwrite:  # under a restarting launcher, each restart would wipe the run
            raise TrainingError(f"--resume {self.resume} continues the run in --out-dir and --overwrite replaces it; "
                                f"give one of them")
        for name, choices in (("model", PRESETS), ("parallel", MODES), ("scale_lr", LR_SCALING_RULES),
                              ("precision", ("auto", "fp32", "bf16", "fp16")), ("resume", RESUME_MODES)):
            self._require(name, getattr(self, name) in choices, f"must be one of {', '.join(choices)}")

    def _require(self, name: str, ok: bool, what: str) -> None:
        if not ok:
            raise TrainingError(f"{flag(name)} {what}, got {getattr(self, name)!r}")

    def check_model_named(self, given: set[str]) -> None:
        """`--init-from none` (or `init-from = "none"`) asks for random weights: of the preset --model names, never of
        the `tiny` default a user who unset a file's init-from did not choose."""
        if self.init_from is None and "init_from" in given and "model" not in given:
            raise TrainingError(f"--init-from none trains from random weights, and no --model names their size; give "
                                f"--model ({', '.join(PRESETS)}) or model = \"...\" in the config file")

    def check_init_size(self, init: GPTConfig, given: set[str]) -> None:
        """--init-from decides the model's size; a --model the user gave beside it must name the same size, or the
        run would train another model than the one the command line names."""
        if "model" not in given:
            return
        named = PRESETS[self.model]
        shape = lambda c: f"{c['n_layer']} layers of width {c['n_embd']} ({c['n_head']} heads)"
        held = {"n_layer": init.n_layer, "n_embd": init.n_embd, "n_head": init.n_head}
        if {key: named[key] for key in held} != held:
            raise TrainingError(f"--model {self.model} is {shape(named)}, but --init-from {self.init_from} holds "
                                f"{shape(held)}, which the run would train; drop --model (--init-from sets the "
                                f"size) or start from a checkpoint of {self.model}'s size")

    @property
    def checkpoint_every(self) -> int:
        return self.checkpoint_interval or self.eval_interval
