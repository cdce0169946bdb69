"""How long a run will take: an estimate as soon as its first micro-batch ends, then the time left at every step.

A GPU-sized run started on a CPU would otherwise print nothing for its whole first log interval (hours), so the
first micro-batch's time is multiplied out at once, and a run far beyond the device is told so with what to change.
"""
from __future__ import annotations

import torch

from runtime.progress import duration

# A CPU run estimated beyond this is called GPU-sized.
GPU_SIZED_S = 12 * 3600


class RunEstimate:
    """The first micro-batch's estimate, then the mean time of the steps taken (evaluation and checkpoints aside)."""

    def __init__(self, steps_to_go: int, grad_accum: int, device: torch.device):
        self.steps_to_go, self.grad_accum, self.device = steps_to_go, grad_accum, device
        self.announced = False
        self.step_seconds, self.steps = 0.0, 0

    def first_micro_batch(self, seconds: float) -> list[str]:
        """The lines to print once the first micro-batch took `seconds` (warm-up included)."""
        self.announced = True
        step = seconds * self.grad_accum
        total = step * self.steps_to_go
        lines = [f"first micro-batch {seconds:.1f} s (warm-up included): about {duration(step)} per step of "
                 f"{self.grad_accum} micro-batch{'es' if self.grad_accum > 1 else ''}, about {duration(total)} for the "
                 f"{self.steps_to_go:,} step{'s' if self.steps_to_go != 1 else ''} to go"]
        if self.device.type == "cpu" and total > GPU_SIZED_S:
            lines.append(f"this run is sized for a GPU: about {duration(step)} per step here, {duration(total)} in "
                         f"all; on the CPU use a smaller preset (--model small-cpu or tiny) or a smaller --batch-size, "
                         f"--block-size or --grad-accum (Ctrl-C or SIGTERM stops within a micro-batch, saving the "
                         f"last whole step)")
        return lines

    def step_done(self, seconds: float) -> None:
        self.step_seconds += seconds
        self.steps += 1

    def left(self, steps_left: int) -> str:
        return duration(self.step_seconds / max(1, self.steps) * steps_left)
