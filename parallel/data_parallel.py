"""Data parallelism: torch DDP, torch FSDP2, the two manual gradient-synchronisation strategies, and
the legacy single-process `nn.DataParallel`.

DDP's and FSDP's own collectives are counted through the hooks torch provides for replacing them
(a DDP communication hook, FSDP2's custom all-gather / reduce-scatter), which call torch's default
implementation after tallying the bytes.
"""
from __future__ import annotations

import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
# FSDP2's default collectives; subclassed only to count their bytes at the call.
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

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


# --- FSDP2 ------------------------------------------------------------------------------------
class _CountedAllGather(DefaultAllGather):
    def __init__(self, meter: CommsMeter):
        super().__init__()
        self.meter = meter

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        self.meter.count("all_gather", tensor_bytes(output_tensor), dist.get_world_size(group))
        with self.meter.timed():
            return super().__call__(output_tensor, input_tensor, group, async_op)


class _CountedReduceScatter(DefaultReduceScatter):
    def __init__(self, meter: CommsMeter):
        super().__init__()
        self.meter = meter

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        self.meter.count("reduce_scatter", tensor_bytes(input_tensor), dist.get_world_size(group))
        with self.meter.timed():
            return super().__call__(output_tensor, input_tensor, group, op, async_op)


def apply_fsdp(model: nn.Module, blocks: nn.ModuleList, dp_mesh: DeviceMesh, meter: CommsMeter,
               param_dtype: torch.dtype | None = None, cpu_offload: bool = False) -> nn.Module:
    """FSDP2 per transformer block (`blocks`, inside `model`), then at the root (embeddings, final
    LayerNorm, tied head).

    `param_dtype` (CUDA autocast dtype) gathers parameters in that dtype and reduces gradients in fp32.
    """
    kwargs = {"mesh": dp_mesh}
    if param_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    units = list(blocks) + [model]
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    for unit in units:
        unit.set_custom_all_gather(_CountedAllGather(meter))
        unit.set_custom_reduce_scatter(_CountedReduceScatter(meter))
    # GPT returns its logits as a view (sliced to the real vocabulary); FSDP2 warns that an in-place
    # op on that view would skip its backward hook.  Nothing here modifies logits in place.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    return model


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
