"""Parallel training for the single-device GPT: torch DDP and FSDP2, hand-written Megatron-style
tensor parallelism, manual gradient synchronisation, and 2D (tp x dp) meshes under torchrun.

    ctx = init_distributed("fsdp", tp_size=2, device=device, timeout_s=300)
    par = parallelize(model, ctx, CommsMeter())
"""
from parallel.comms import CommsMeter
from parallel.distributed import MODES, DistContext, ParallelError, check_divisibility, init_distributed
from parallel.lr_scaling import scaled_lr
from parallel.parallelize import ParallelModel, parallelize
from parallel.tensor_parallel import TP_PLAN, ColumnParallelLinear, RowParallelLinear, apply_tensor_parallel

__all__ = ["CommsMeter", "MODES", "DistContext", "ParallelError", "check_divisibility", "init_distributed",
           "scaled_lr", "ParallelModel", "parallelize", "TP_PLAN", "ColumnParallelLinear", "RowParallelLinear",
           "apply_tensor_parallel"]
