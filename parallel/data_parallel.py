"""Data parallelism: torch DDP, the two manual gradient-synchronisation strategies, and the legacy
single-process `nn.DataParallel` (FSDP2 is parallel/fsdp.py).

DDP's own collectives are counted through the communication hook torch provides for replacing them,
which calls torch's default all-reduce after tallying the bytes.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from parallel.comms import CommsMeter, tensor_bytes
from parallel.errors import ParallelError


# --- DDP --------------------------------------------------------------------------------------
class _DDPHookState:
    """Counts each gradient bucket; the exposed communication is the wait after the last bucket left."""

    def __init__(self, group, meter: CommsMeter):
        self.group, self.meter = group, meter
        self.last_launch = None



def _counting_allreduce_hook(state: _DDPHookState, bucket):
    """DDP's default bucket all-reduce, after counting the bucket and noting when it left."""
    state.meter.count("all_reduce", tensor_bytes(bucket.buffer()), dist.get_world_size(state.group))
    state.last_launch = launched = time.perf_counter()
    meter = state.meter

    def finished(fut):
        if meter.enabled:
            meter.seconds += time.perf_counter() - launched
        return fut.value()[0]
    return allreduce_hook(state.group, bucket).then(finished)


def apply_ddp(model: nn.Module, dp_group, device: torch.device, meter: CommsMeter) -> nn.Module:
    """torch DDP (bucketed all-reduce overlapping backward) over `dp_group`."""
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                              process_group=dp_group)
    ddp.hook_state = _DDPHookState(dp_group, meter)
    ddp.register_comm_hook(ddp.hook_state, _counting_allreduce_hook)
    return ddp


def ddp_exposed_wait(ddp: nn.Module, backward_end: float) -> float:
    """Seconds between the last bucket's launch and the end of backward: communication left unhidden."""
    last = ddp.hook_state.last_launch
    ddp.hook_state.last_launch = None
    return max(0.0, backward_end - last) if last is not None else 0.0


# --- manual gradient synchronisation ----------------------------------------------------------
def allreduce_gradients(params: list[nn.Parameter], group, meter: CommsMeter) -> None:
    """One all-reduce per parameter after backward, then divide by the number of ranks."""
    n = dist.get_world_size(group)
    for p in params:
        if p.grad is None:
            continue
        meter.count("all_reduce", tensor_bytes(p.grad), n)
        with meter.timed():
            dist.all_reduce(p.grad, group=group)
        p.grad.div_(n)


def gather_scatter_gradients(params: list[nn.Parameter], group, meter: CommsMeter) -> None:
    """Every gradient gathered to the group's first rank, averaged there and scattered back."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    root = dist.get_global_rank(group, 0)
    for p in params:
        if p.grad is None:
            continue
        grad = p.grad
        received = [torch.empty_like(grad) for _ in range(n)] if me == 0 else None
        meter.count("gather", tensor_bytes(grad), n, is_root=me == 0)
        meter.count("scatter", tensor_bytes(grad), n, is_root=me == 0)
        with meter.timed():
            dist.gather(grad, received, dst=root, group=group)
            mean = torch.stack(received).mean(dim=0) if me == 0 else None
            dist.scatter(grad, [mean] * n if me == 0 else None, src=root, group=group)


# --- legacy single-process DataParallel -------------------------------------------------------
def visible_cuda_devices(device: torch.device) -> int:
    return torch.cuda.device_count() if device.type == "cuda" else 0


def replicate_with_data_parallel(model: nn.Module, device: torch.device) -> nn.Module:
    """`nn.DataParallel` over every visible CUDA device (one process splits each batch)."""
    count = visible_cuda_devices(device)
    if count < 2:
        where = "one CUDA device" if count == 1 else f"{device.type}"
        raise ParallelError(f"--parallel dp (torch.nn.DataParallel) needs two or more CUDA devices in one "
                            f"process; this run has {where}. Use --parallel ddp under torchrun instead "
                            f"(it is faster on any hardware)")
    return nn.DataParallel(model)
