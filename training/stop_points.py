"""Points inside a micro-batch where the ranks agree on a stop signal: before each transformer block's forward and
after its backward, so that a stop during a micro-batch longer than the launcher's grace still saves in time.

Each point is a hook on a block (a forward pre-hook, and from it a hook on the gradient of the block's input), so
every rank reaches the same points in the same order, between the same collectives of the model's layout: the ranks
agree there (training/stop_signals.py) and, on a stop, raise at the same point, leaving no rank in a collective that
the others have left.  The forward hook runs before the block's own hooks (FSDP2's gathering of its parameters is
one), and the gradient of its input is complete only once the block's backward and FSDP2's post-backward (the
reduce-scatter of its gradients) are done, so a stop leaves no block half-gathered or half-reduced; the step's partial
gradients are then discarded (training/step.py).

The points are armed only while micro-batches are long against the grace (ARM_SHARE of it, measured on the slowest
rank): an agreement is an all-reduce, two per block and micro-batch, which costs nothing to notice against a
micro-batch of seconds but would against one of milliseconds, whose end is near anyway.  The first micro-batch of a
run, of unknown length, is armed.  In one process there is nothing to agree and the points are always armed.  Not
installed under --compile (a hook that raises would break the compiled graph at every block) nor under nn.DataParallel
(its replicas run the blocks in threads): there the stop waits for the micro-batch to end.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

ARM_SHARE = 0.1  # arm the points when a micro-batch takes at least this share of the grace


class StopPoints:
    def __init__(self, blocks: nn.ModuleList, check: Callable[[], None]):
        """`check()`: the ranks' agreement, raising to stop (every rank calls it at the same points)."""
        self.check = check
        self.armed = False  # set by the trainer around each step's micro-batches
        # Prepended: before the hooks fully_shard has put on the block, so a stop there gathers nothing.
        self.handles = [block.register_forward_pre_hook(self.before_block, prepend=True) for block in blocks]

    def before_block(self, module: nn.Module, args) -> None:
        if not self.armed:
            return
        self.check()
        x = args[0]
        if torch.is_grad_enabled() and x.requires_grad:
            x.register_hook(self.after_block_backward)

    def after_block_backward(self, grad: torch.Tensor) -> None:
        if self.armed:
            self.check()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
