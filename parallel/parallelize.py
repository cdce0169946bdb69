"""One entry point: take the full single-device GPT and a `DistContext`, return it parallelised.

Order (as torchtitan): tensor parallelism first (the layout), then the data-parallel strategy over the
remaining mesh dimension (parallel/strategies.py).  A model built on the meta device gets its values where each
strategy needs them: before a replicating wrapper, after FSDP has cut the parameters.  Consolidating the state for checkpoints is
training's (training/checkpoint/gather.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn as nn

from model.gpt import GPT
from parallel.comms import CommsMeter
from parallel.distributed import DistContext
from parallel.errors import ParallelError
from parallel.materialize import materialize
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
                param_dtype: torch.dtype | None = None, cpu_offload: bool = False,
                values: Iterable[tuple[str, torch.Tensor]] | None = None) -> Parallelized:
    """Lay the model out on `ctx`'s sizes, its data-parallel replicas combined by `strategy_class`: either the full
    model (same weights on every rank), or, with `values`, one built on the meta device, whose pieces each rank
    then materialises from those full single-device values (parallel/materialize.py)."""
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
    if values is not None and not strategy.shards_parameters:  # a replica's wrapper (DDP) starts from the values
        materialize(model, layout, ctx, values, ctx.device)
    train_module, eval_module = strategy.wrap(module, param_dtype, cpu_offload)
    if values is not None and strategy.shards_parameters:  # FSDP has cut the parameters: fill this rank's shards
        materialize(model, layout, ctx, values, torch.device("cpu") if cpu_offload else ctx.device)
    return Parallelized(ctx, model, train_module, eval_module, strategy, layout, note)
