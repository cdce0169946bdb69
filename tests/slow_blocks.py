"""train.py with every transformer block made slow in training, forward and backward alike, by SLOW_BLOCK_S seconds
each (tests only): a micro-batch of the tiny model then outlasts a launcher's grace, as one of GPT-2 Medium does on a
CPU, in seconds instead of minutes.  Run it where train.py would be run: `torchrun ... tests/slow_blocks.py FLAGS`.
Validation and a save's probe (no gradient) are not slowed."""
from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

import torch

from model import gpt

SECONDS = float(os.environ["SLOW_BLOCK_S"])
TRAIN_PY = Path(__file__).resolve().parent.parent / "train.py"


class SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(SECONDS)
        return grad


def slow_forward(self, *args, **kwargs):
    out = real_forward(self, *args, **kwargs)
    if not torch.is_grad_enabled():
        return out
    time.sleep(SECONDS)
    return SlowBackward.apply(out)


real_forward = gpt.Block.forward
gpt.Block.forward = slow_forward  # FSDP2's wrapped blocks subclass Block and find it there too

if __name__ == "__main__":
    sys.argv = [str(TRAIN_PY), *sys.argv[1:]]
    runpy.run_path(str(TRAIN_PY), run_name="__main__")
