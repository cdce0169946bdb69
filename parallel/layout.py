"""From the command line to the layout: `--parallel MODE --tp-size N` under this launch become the sizes
(`ParallelDims`) and the strategy that combines the data-parallel replicas.  The only place a mode name
is read; everything after works from the sizes and the strategy class.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from parallel.dims import ParallelDims
from parallel.distributed import launched_by_torchrun, launched_world_size
from parallel.errors import ParallelError
from parallel.strategies import STRATEGIES, DataParallelStrategy

# The names --parallel accepts, in the order the help lists them; the torchrun ones.
MODES = tuple(STRATEGIES)
MULTI_PROCESS_MODES = tuple(name for name, cls in STRATEGIES.items() if cls.multi_process)


@dataclass(frozen=True)
class Layout:
    dims: ParallelDims
    strategy: type[DataParallelStrategy]


def layout_from_flags(mode: str, tp_size: int) -> Layout:
    """`--parallel mode --tp-size tp_size`, checked against how this process was launched."""
    strategy = strategy_named(mode)
    if strategy.multi_process and not dist.is_initialized() and not launched_by_torchrun():
        raise ParallelError(f"--parallel {mode} needs one process per rank; launch with "
                            f"`torchrun --nproc_per_node=N train.py --parallel {mode}`")
    return Layout(parallel_dims(mode, tp_size, launched_world_size()), strategy)


def parallel_dims(mode: str, tp_size: int, world_size: int) -> ParallelDims:
    """The sizes `--parallel mode --tp-size tp_size` give a job of `world_size` ranks."""
    strategy = strategy_named(mode)
    if not strategy.multi_process:
        if world_size > 1:
            raise ParallelError(f"--parallel {mode} runs in one process, but torchrun started "
                                f"{world_size}; use --parallel ddp (or fsdp, tp) under torchrun")
        if tp_size != 1:
            raise ParallelError(f"--tp-size {tp_size} needs --parallel ddp or fsdp (2D) or tp under torchrun")
        return ParallelDims()
    if not strategy.data_parallel and tp_size == 1:
        tp_size = world_size  # pure tensor parallelism over every rank
    if tp_size < 1 or world_size % tp_size:
        raise ParallelError(f"--tp-size {tp_size} does not divide the {world_size} ranks; pick a divisor of "
                            f"{world_size}")
    if not strategy.data_parallel and tp_size != world_size:
        raise ParallelError(f"--parallel {mode} uses every rank for tensor parallelism ({world_size}), but "
                            f"--tp-size is {tp_size}; for 2D use --parallel fsdp --tp-size {tp_size} (or ddp)")
    if not strategy.composes_with_tensor_parallel and tp_size != 1:
        raise ParallelError(f"--parallel {mode} is data-parallel only; drop --tp-size or use ddp/fsdp for 2D")
    dp = world_size // tp_size
    if strategy.shards_parameters:
        return ParallelDims(dp_shard=dp, tp=tp_size, distributed=True)
    return ParallelDims(dp_replicate=dp, tp=tp_size, distributed=True)


def strategy_named(mode: str) -> type[DataParallelStrategy]:
    if mode not in STRATEGIES:
        raise ParallelError(f"unknown --parallel {mode!r}; choose one of {', '.join(MODES)}")
    return STRATEGIES[mode]
