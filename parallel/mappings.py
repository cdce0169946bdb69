"""Tensor-parallel communication in three layers (after Megatron-LM's `tensor_parallel/mappings.py`).

1. raw collectives on the last dimension (all-reduce, split, gather);
2. autograd pairs: copy-to (identity forward, all-reduce backward), reduce-from (all-reduce forward,
   identity backward), gather-from (gather forward, split backward): what the GPT plan takes (Megatron's
   scatter-to, for a row-parallel layer whose input is not already split, has no such layer here);
3. thin wrappers.  Every op returns its input untouched when the group has one rank.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from parallel.comms import CommsMeter, counted_all_gather, counted_all_reduce


# --- 1. raw collectives -----------------------------------------------------------------------
def _reduce(x: torch.Tensor, group, meter: CommsMeter | None) -> torch.Tensor:
    if dist.get_world_size(group) == 1:
        return x
    return counted_all_reduce(x.contiguous(), group, meter)


def _split_last(x: torch.Tensor, group) -> torch.Tensor:
    n = dist.get_world_size(group)
    if n == 1:
        return x
    if x.size(-1) % n:
        raise ValueError(f"last dimension {x.size(-1)} is not divisible by the {n} tensor-parallel ranks")
    return x.chunk(n, dim=-1)[dist.get_rank(group)].contiguous()


def _gather_last(x: torch.Tensor, group, meter: CommsMeter | None) -> torch.Tensor:
    if dist.get_world_size(group) == 1:
        return x
    return torch.cat(counted_all_gather(x.contiguous(), group, meter), dim=-1)


# --- 2. autograd pairs ------------------------------------------------------------------------
class _CopyToParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, meter):
        ctx.group, ctx.meter = group, meter
        return x

    @staticmethod
    def backward(ctx, grad):
        return _reduce(grad.clone(), ctx.group, ctx.meter), None, None


class _ReduceFromParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, meter):
        return _reduce(x.clone(), group, meter)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _GatherFromParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, meter):
        ctx.group = group
        return _gather_last(x, group, meter)

    @staticmethod
    def backward(ctx, grad):
        return _split_last(grad, ctx.group), None, None


# --- 3. wrappers ------------------------------------------------------------------------------
def copy_to_tensor_parallel_region(x, group, meter=None):
    return x if dist.get_world_size(group) == 1 else _CopyToParallelRegion.apply(x, group, meter)


def reduce_from_tensor_parallel_region(x, group, meter=None):
    return x if dist.get_world_size(group) == 1 else _ReduceFromParallelRegion.apply(x, group, meter)


def gather_from_tensor_parallel_region(x, group, meter=None):
    return x if dist.get_world_size(group) == 1 else _GatherFromParallelRegion.apply(x, group, meter)
