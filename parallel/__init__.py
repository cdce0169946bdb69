"""Parallel training for the single-device GPT: torch DDP and FSDP2, hand-written Megatron-style
tensor parallelism, manual gradient synchronisation, and 2D (tp x dp) meshes under torchrun.

    layout = layout_from_flags("fsdp", tp_size=2)   # layout.dims: the sizes; layout.strategy: the dp strategy
    ctx = init_distributed(layout.dims, device=device, timeout_s=300)
    par = parallelize(model, ctx, layout.strategy, CommsMeter())
"""
from parallel.comms import CommsMeter
from parallel.dims import ParallelDims
from parallel.distributed import DistContext, check_divisibility, init_distributed
from parallel.errors import ParallelError
from parallel.layout import MODES, Layout, layout_from_flags
from parallel.parallelize import Parallelized, parallelize
from parallel.strategies import STRATEGIES, DataParallelStrategy, SingleDevice
from parallel.tensor_parallel import TP_PLAN, ColumnParallelLinear, RowParallelLinear, apply_tensor_parallel

__all__ = ["CommsMeter", "MODES", "STRATEGIES", "DataParallelStrategy", "SingleDevice", "DistContext", "Layout",
           "ParallelDims", "ParallelError", "check_divisibility", "init_distributed", "layout_from_flags",
           "Parallelized", "parallelize", "TP_PLAN", "ColumnParallelLinear", "RowParallelLinear",
           "apply_tensor_parallel"]
