"""Giving a model laid out on the meta device its values, each rank keeping only its piece (torchtitan's way: build
on meta, parallelise, then materialise the shards).

`parallelize` lays the empty model out as it would a full one and calls `materialize`, which allocates each rank's
shards and fills them from full single-device tensors handed over one at a time (model/deferred_init.py's seeded values), each
cut to this rank's tensor-parallel slice and data-parallel shard as soon as it arrives.  A rank therefore holds its
shards plus one full parameter at most, never the whole model, and the shards are exactly the slices of the
single-device weights.
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.nn as nn

from parallel.distributed import DistContext
from parallel.local_state import is_dtensor
from parallel.tensor_parallel import ShardSpec


def builds_on_meta(ctx, strategy_class) -> bool:
    """Whether `parallelize` on this layout leaves each rank a piece of the parameters (tensor parallelism, or a
    sharding strategy over more than one data-parallel rank), so that building the whole model first would hold
    more than the rank keeps."""
    return ctx.dims.tp_enabled or (strategy_class.shards_parameters and ctx.dims.dp_enabled)


def local_piece(ctx: DistContext, spec: ShardSpec | None, full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's piece of the single-device tensor `full` of a parameter that tensor parallelism splits as `spec`
    (None: replicated), laid out as `like` holds it locally: its tensor-parallel slice, then its data-parallel shard
    (cut here, with no communication)."""
    if spec is not None and ctx.dims.tp_enabled:
        full = spec.shard(full, ctx.tp_rank, ctx.tp_size)
    if is_dtensor(like):
        from torch.distributed.tensor import distribute_tensor
        return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None).to_local()
    return full


def materialize(model: nn.Module, layout: dict[str, ShardSpec], ctx: DistContext,
                values: Iterable[tuple[str, torch.Tensor]], device: torch.device) -> None:
    """Allocate the meta-built GPT's parameters on `device` (this rank's pieces only, as `layout` and the FSDP
    wrapping cut them) and fill each from `values`: (single-device name, full tensor) for every parameter, one at a
    time."""
    model.to_empty(device=device)
    # to_empty gives every parameter slot a new tensor, so the tied head and the embedding would part.
    model.lm_head.weight = model.transformer.wte.weight
    params = dict(model.named_parameters())
    missing = set(params)
    with torch.no_grad():
        for name, full in values:
            p = params[name]
            target = p.to_local() if is_dtensor(p) else p
            target.copy_(local_piece(ctx, layout.get(name), full, p))
            missing.discard(name)
    if missing:
        raise ValueError(f"materialize: no values for {sorted(missing)[:5]}")
