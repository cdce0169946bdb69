"""Counting and timing collectives at their call sites.

Every collective that parallel/ issues (or that DDP and FSDP issue through the hooks installed
here) reports its payload to a `CommsMeter`: the bytes of the buffer handed to the collective and
the bytes this rank sends for it under the usual algorithm (ring all-reduce sends 2(n-1)/n of the
buffer, ring all-gather and reduce-scatter (n-1)/n, a gather's non-root ranks their input, a
scatter's root all but its own chunk).  The trainer reads and resets the meter once per log window.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch
import torch.distributed as dist


def sent_bytes(kind: str, payload: int, n: int, is_root: bool = False) -> float:
    """Bytes one rank sends for a collective over `n` ranks on a buffer of `payload` bytes."""
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) / n * payload
    if kind in ("all_gather", "reduce_scatter"):  # payload: the full (gathered / unreduced) buffer
        return (n - 1) / n * payload
    if kind == "gather":  # payload: this rank's contribution
        return 0.0 if is_root else float(payload)
    if kind == "scatter":  # payload: one rank's chunk
        return (n - 1) * payload if is_root else 0.0
    raise ValueError(f"unknown collective kind {kind!r}")


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class CommsMeter:
    """Payload bytes, bytes sent and seconds spent per collective kind since the last `reset()`."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.payload: dict[str, int] = defaultdict(int)
        self.sent: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.seconds = 0.0          # time the calling thread spent inside collectives
        self.exposed_seconds = 0.0  # for overlapped modes: communication the compute could not hide
        self.enabled = True

    @contextlib.contextmanager
    def paused(self):
        """Evaluation and checkpointing are not part of a training step's communication."""
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = True

    def count(self, kind: str, payload: int, n: int, is_root: bool = False) -> None:
        if n <= 1 or not self.enabled:
            return
        self.payload[kind] += payload
        self.sent[kind] += sent_bytes(kind, payload, n, is_root)
        self.calls[kind] += 1

    @contextlib.contextmanager
    def timed(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.enabled:
                self.seconds += time.perf_counter() - t0

    def snapshot(self) -> dict:
        return {"payload_bytes": dict(self.payload), "sent_bytes": dict(self.sent), "calls": dict(self.calls),
                "comm_s": self.seconds, "exposed_comm_s": self.exposed_seconds}


def counted_all_reduce(t: torch.Tensor, group, meter: CommsMeter | None, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """In-place all-reduce of `t` over `group`, counted and timed; returns `t`."""
    n = dist.get_world_size(group)
    if n == 1:
        return t
    if meter is None:
        dist.all_reduce(t, op=op, group=group)
        return t
    meter.count("all_reduce", tensor_bytes(t), n)
    with meter.timed():
        dist.all_reduce(t, op=op, group=group)
    return t


def counted_all_gather(t: torch.Tensor, group, meter: CommsMeter | None) -> list[torch.Tensor]:
    """Every rank's `t` (same shape), in rank order."""
    n = dist.get_world_size(group)
    if n == 1:
        return [t]
    out = [torch.empty_like(t) for _ in range(n)]
    if meter is not None:
        meter.count("all_gather", tensor_bytes(t) * n, n)
    with meter.timed() if meter is not None else contextlib.nullcontext():
        dist.all_gather(out, t.contiguous(), group=group)
    return out
