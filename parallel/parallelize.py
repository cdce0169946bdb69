"""One entry point: take the full single-device GPT and a `DistContext`, return it parallelised.

Order (as torchtitan): tensor parallelism first (the layout), then the data-parallel strategy over the
remaining mesh dimension (parallel/strategies.py).  Consolidating the state for checkpoints is
training's (training/checkpoint/gather.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from model.gpt import GPT
from parallel.comms import CommsMeter
from parallel.distributed import DistContext
from parallel.errors import ParallelError
from parallel.strategies import DataParallelStrategy, SingleDevice
from parallel.tensor_parallel import ShardSpec, apply_tensor_parallel


@dataclass
class Parallelized:
    ctx: DistContext
    model: GPT  # the single-device GPT whose (possibly sliced) parameters the optimizer steps
    module: nn.Module  # what training runs forward and backward on
    eval_module: nn.Module
    strategy: DataParallelStrategy
    layout: dict[str, ShardSpec]  # parameter name -> how tensor parallelism shards it; others replicated
    note: str = ""

    @property
    def is_distributed(self) -> bool:
        """Launched as a multi-process job (a process group and mesh exist, even with one rank)."""
        return self.ctx.mesh is not None


def parallelize(model: GPT, ctx: DistContext, strategy_class: type[DataParallelStrategy], meter: CommsMeter,
                param_dtype: torch.dtype | None = None, cpu_offload: bool = False) -> Parallelized:
    """Lay the full model (same weights on every rank) out on `ctx`'s sizes, its data-parallel replicas
    combined by `strategy_class`."""
    if cpu_offload and not strategy_class.shards_parameters:
        raise ParallelError("--cpu-offload applies to --parallel fsdp only")
    module, layout, note = model, {}, ""
    if ctx.dims.tp_enabled:
        module = apply_tensor_parallel(model, ctx.tp_group, meter)
        layout = module.layout
    if strategy_class.data_parallel and ctx.dims.distributed and not ctx.dims.dp_enabled:
        # Nothing to communicate: the wrappers would only add copies and hooks.
        note = f"one data-parallel rank: no {strategy_class.name} wrapper applied (nothing to synchronise)"
        strategy_class = SingleDevice
    strategy = strategy_class(model, ctx, meter, layout)
    train_module, eval_module = strategy.wrap(module, param_dtype, cpu_offload)
    return Parallelized(ctx, model, train_module, eval_module, strategy, layout, note)
