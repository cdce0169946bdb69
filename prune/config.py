"""prune/iterative.py's settings: one typed dataclass filled from its command line, checked on its own
(`__post_init__`) and against the loaded model (`validate_against_model`)."""
from __future__ import annotations

from dataclasses import dataclass

from data.corpus import DATASET_NAMES
from model.gpt import GPT
from prune.errors import PruneError
from prune.methods import METHODS, PruningMethod
from prune.schedule import SCHEDULES
from prune.speed import GENERATION_PROMPT_TOKENS
from runtime.cli import check_options, option

DEFAULT_OUT_DIR = "out/prune"


@dataclass
class PruneConfig:
    target: float | None = option(None, "final sparsity (row: the share of each layer's heads and MLP "
                                        "units removed) [required]", above=0, below=1)
    method: str = option("magnitude", "magnitude (global unstructured), row (structured: heads and MLP units), "
                                      "wanda (|w| x activation norm); several, comma-separated (magnitude,row), "
                                      "run one after the other from the same checkpoint into one report")
    checkpoint: str | None = option(None, "artifact folder or hub name to prune (default: the train.py checkpoint "
                                          "under out/ trained on the most tokens)")
    rounds: int = option(4, "pruning rounds, each followed by fine-tuning and evaluation", min=1)
    schedule: str = option("cubic", "cubic (Zhu & Gupta) or geometric: the sparsity reached after each round",
                           choices=SCHEDULES)
    finetune_steps: int = option(40, "training steps after each round (0: prune only)", min=0)
    lr: float = option(3e-4, "peak fine-tuning learning rate (cosine decay within each round)", above=0)
    weight_decay: float = option(0.1, "fine-tuning AdamW weight decay")
    warmup_steps: int = option(5, "linear warmup steps at the start of each round's fine-tune", min=0)
    batch_size: int = option(8, "fine-tuning, evaluation and calibration batch size", min=1)
    block_size: int | None = option(None, "fine-tuning and evaluation context (default: min(128, the model's))",
                                    min=1)
    eval_batches: int = option(10, "validation batches per evaluation (the same leading windows every time)",
                               min=1)
    calibration_batches: int = option(4, "training batches whose activations wanda scores with", min=1)
    prune_params: str = option("linear", "magnitude: comma-separated groups to prune among linear, bias, "
                                         "layernorm, embedding (wanda: linear only; row: ignored)")
    dataset: str | None = option(None, f"{', '.join(DATASET_NAMES)} or a local folder (default: the checkpoint's "
                                       f"training dataset)")
    out_dir: str = option(DEFAULT_OUT_DIR, "folder for the pruned checkpoint, prune_report.json and plots")
    overwrite: bool = option(False, "write into --out-dir even though it holds another tool's artifact (whose "
                                    "files are removed first)")
    device: str = option("auto", "auto (CUDA if present, else CPU), cpu, cuda, cuda:1, ...")
    precision: str = option("auto", "auto (fp32 on CPU, bf16/fp16 autocast on CUDA), fp32, bf16, fp16")
    threads: int | None = option(None, "CPU threads for torch (default: torch's choice); 1 gives steadier timings "
                                       "on a shared machine", min=1)
    seed: int = option(1234, "seed of the fine-tuning batches")
    speed_batch: int = option(4, "batch size of the timed forward passes", min=1)
    speed_seq_len: int = option(128, "sequence length of the timed forward passes", min=1)
    speed_repeats: int = option(5, "timed repeats (after one warm-up); medians are reported", min=1)
    generation_tokens: int = option(16, "new tokens per timed generation (batch 1, greedy, KV cache)",
                                  min=1)
    sparse_format_check: bool = option(True, "magnitude/wanda: also time the model with its weights in sparse "
                                             "CSR format")
    dense_control: bool = option(False, "also fine-tune the unpruned model for the run's total fine-tune steps, "
                                        "to separate the effect of pruning from that of the extra training")

    def __post_init__(self):
        method_names(self)  # names the unknown method
        if self.target is None:
            raise PruneError("--target is required: the final sparsity, e.g. --target 0.8")
        check_options(self, PruneError)
        for name in method_names(self):
            METHODS[name](self.prune_params)  # each refuses a --prune-params it cannot work with


def method_names(cfg: PruneConfig) -> list[str]:
    names = [m.strip() for m in cfg.method.split(",") if m.strip()]
    unknown = [m for m in names if m not in METHODS]
    if unknown or not names:
        raise PruneError(f"--method {cfg.method!r}: choose from {', '.join(METHODS)} (several: comma-separated)")
    return names


def validate_against_model(cfg: PruneConfig, model: GPT, method: PruningMethod) -> int:
    """Checks that need the model; returns the fine-tuning and evaluation block size."""
    config = model.config
    block = cfg.block_size or min(128, config.block_size)
    if block > config.block_size:
        raise PruneError(f"--block-size {block} exceeds the model's context of {config.block_size}")
    if cfg.speed_seq_len > config.block_size:
        raise PruneError(f"--speed-seq-len {cfg.speed_seq_len} exceeds the model's context of {config.block_size}")
    if GENERATION_PROMPT_TOKENS + cfg.generation_tokens > config.block_size:
        raise PruneError(f"--generation-tokens {cfg.generation_tokens} plus the {GENERATION_PROMPT_TOKENS}-token "
                         f"prompt exceeds the model's context of {config.block_size}")
    method.check(config, cfg.target)
    return block
