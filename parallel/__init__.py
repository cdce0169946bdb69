"""Parallel training for the single-device GPT: torch DDP and FSDP2, hand-written Megatron-style
tensor parallelism, manual gradient synchronisation, and 2D (tp x dp) meshes under torchrun.

    ctx = init_distributed("fsdp", tp_size=2, device=device, timeout_s=300)
    par = parallelize(model, ctx, CommsMeter())     # par.strategy: the data-parallel strategy
"""
from parallel.comms import CommsMeter
from parallel.distributed import DistContext, check_divisibility, init_distributed
from parallel.errors import ParallelError
from parallel.lr_scaling import scaled_lr
from parallel.parallelize import Parallelized, parallelize
from parallel.strategies import MODES, STRATEGIES, DataParallelStrategy, SingleDevice
from parallel.tensor_parallel import TP_PLAN, ColumnParallelLinear, RowParallelLinear, apply_tensor_parallel

__all__ = ["CommsMeter", "MODES", "STRATEGIES", "DataParallelStrategy", "SingleDevice", "DistContext",
           "ParallelError", "check_divisibility", "init_distributed", "scaled_lr", "Parallelized", "parallelize",
           "TP_PLAN", "ColumnParallelLinear", "RowParallelLinear", "apply_tensor_parallel"]
