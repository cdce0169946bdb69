"""The peak learning rate each model preset trains with unless --lr is given, and where each figure comes from.

The GPT-2 sizes take the rate of the GPT-3 paper's model of nearest size (Brown et al. 2020, "Language Models are
Few-Shot Learners", Table 2.1: 125M 6.0e-4, 350M 3.0e-4, 760M 2.5e-4, 1.3B 2.0e-4), as nanoGPT's GPT-2 (124M)
reproduction does with 6e-4.  The rest of that recipe is what train.py already defaults to for every size: AdamW
with betas (0.9, 0.95) and weight decay 0.1, gradients clipped at 1.0, a cosine decay to --min-lr-ratio of the peak.  Two of its
settings are not taken: the batch (0.5M tokens for 125M-760M, 1M for 1.3B) and the warmup (375M tokens, 715 steps of
nanoGPT's 524,288-token batch) are sized for runs of 300B tokens, and on the batches a CPU or one GPU holds they would
make every run of this repository all warmup; --warmup-steps stays 50 and the batch is the user's to set.
"""
from __future__ import annotations

from dataclasses import dataclass

GPT3_TABLE = "GPT-3 paper Table 2.1"


@dataclass(frozen=True)
class DefaultLr:
    value: float
    source: str  # where the figure comes from, as the first log line says it


# The CPU presets (and a run from --init-from, whose size the preset name does not describe) keep the rate the
# demo and the tests were tuned with.
TRAIN_PY_DEFAULT = DefaultLr(1e-3, "train.py's default for the CPU presets")
PRESET_LR: dict[str, DefaultLr] = {
    "tiny": TRAIN_PY_DEFAULT,
    "small-cpu": TRAIN_PY_DEFAULT,
    "gpt2": DefaultLr(6e-4, f"{GPT3_TABLE}, 125M"),
    "gpt2-medium": DefaultLr(3e-4, f"{GPT3_TABLE}, 350M"),
    "gpt2-large": DefaultLr(2.5e-4, f"{GPT3_TABLE}, 760M"),
    "gpt2-xl": DefaultLr(2e-4, f"{GPT3_TABLE}, 1.3B (the nearest size to its 1.5B)"),
}
INIT_FROM_LR = DefaultLr(1e-3, "train.py's default with --init-from")


def default_lr(model: str, init_from: str | None) -> DefaultLr:
    """The peak learning rate a run of preset `model` (or from --init-from) takes when --lr is not given."""
    if init_from:
        return INIT_FROM_LR
    return PRESET_LR.get(model, TRAIN_PY_DEFAULT)  # an unknown preset is refused by TrainConfig's own check


def describe_lr(lr: float, model: str, init_from: str | None) -> str:
    """`lr 3.00e-04 (gpt2-medium default, GPT-3 paper Table 2.1, 350M)`, or `(given)` for another value."""
    default = default_lr(model, init_from)
    if lr != default.value:
        return f"lr {lr:.2e} (given)"
    return f"lr {lr:.2e} ({'--init-from' if init_from else model} default, {default.source})"
