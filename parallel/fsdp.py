"""FSDP2 (torch's `fully_shard`) per transformer block and at the root, with its collectives counted.

Its own module because importing torch's FSDP and DTensor packages is slow, a cost which every
process that trains without FSDP (one device, DDP, TP, and every tool that only loads a model) is spared:
the FSDP strategy imports this module when it wraps a model.  The collectives are counted through the
custom all-gather / reduce-scatter hooks FSDP2 provides, which call its default implementation after
tallying the bytes.
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
# FSDP2's default collectives; subclassed only to count their bytes at the call.
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

from parallel.comms import CommsMeter, tensor_bytes


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
