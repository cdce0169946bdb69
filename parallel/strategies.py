"""How data-parallel replicas combine their gradients: one class per `--parallel` mode, one small interface.

The training step calls only this interface (`gradient_sync`, `after_backward`, `sync_gradients`,
`clip_grad_norm`, `mean_over_data_parallel`); the trainer asks it for the communication it should
measure (`theoretical_bytes`, `comm_time_is_exposed_wait`).  Tensor parallelism is the layout every
strategy is composed with (`parallel/parallelize.py`); pure `--parallel tp` is that layout over every
rank with nothing to combine (`TensorParallel`).  Adding a mode means adding a class here and listing
it in `STRATEGIES`.
"""
from __future__ import annotations

import contextlib
import time
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn as nn

from model.gpt import GPT
from parallel.comms import CommsMeter, counted_all_reduce, sent_bytes
from parallel.data_parallel import (allreduce_gradients, apply_ddp, ddp_exposed_wait, gather_scatter_gradients,
                                    replicate_with_data_parallel)
from parallel.distributed import DistContext
from parallel.local_state import is_dtensor
from parallel.tensor_parallel import ShardSpec


class DataParallelStrategy:
    name: ClassVar[str]
    multi_process: ClassVar[bool] = True  # one process per rank under torchrun
    data_parallel: ClassVar[bool] = True  # combines the gradients of data-parallel replicas
    composes_with_tensor_parallel: ClassVar[bool] = True
    comm_time_is_exposed_wait: ClassVar[bool] = False  # else the meter's time is spent inside collectives
    shards_parameters: ClassVar[bool] = False  # each dp rank holds a slice of every parameter
    # The model's blocks run in the thread that called forward and backward, so a hook on a block can stop the step
    # there (training/stop_points.py); nn.DataParallel runs its replicas' blocks in threads of its own.
    blocks_run_in_calling_thread: ClassVar[bool] = True

    def __init__(self, model: GPT, ctx: DistContext, meter: CommsMeter, layout: dict[str, ShardSpec] | None = None):
        """`model` is the single-device GPT whose parameters are the ones the optimizer steps (the
        tensor-parallel slices, when `layout` names them)."""
        self.model, self.ctx, self.meter, self.layout = model, ctx, meter, layout or {}

    def wrap(self, module: nn.Module, param_dtype: torch.dtype | None, cpu_offload: bool) -> tuple[nn.Module, nn.Module]:
        """(the module training runs, the module evaluation runs)."""
        return module, module

    # --- the training step ---------------------------------------------------------------------
    def gradient_sync(self, sync: bool):
        """Context for one micro-batch's forward and backward; `sync=False` (not the last micro-batch of a
        step) lets strategies that reduce during backward skip it."""
        return contextlib.nullcontext()

    def after_backward(self, backward_end: float) -> None:
        pass

    def sync_gradients(self) -> None:
        """Combine the replicas' gradients, for strategies that do it after backward."""

    def after_evaluation(self) -> None:
        pass

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip to the global gradient norm and return it (a plain tensor): tensor-parallel shards summed
        over the tp group, replicated parameters counted once, parameter shards summed over the dp group."""
        if not self.layout:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
            return norm.full_tensor() if is_dtensor(norm) else norm
        device = self.ctx.device
        sharded, replicated = torch.zeros((), device=device), torch.zeros((), device=device)
        grads = []
        for name, p in self.model.named_parameters():
            if p.grad is None:
                continue
            grads.append(p.grad)
            local = p.grad.to_local() if is_dtensor(p.grad) else p.grad
            square = local.detach().float().pow(2).sum().to(device)
            if name in self.layout:
                sharded += square
            else:
                replicated += square
        total = counted_all_reduce(sharded, self.ctx.tp_group, self.meter) + replicated
        if self.shards_parameters:
            total = counted_all_reduce(total, self.ctx.dp_group, self.meter)
        norm = total.sqrt()
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.device))
        return norm

    def mean_over_data_parallel(self, value: torch.Tensor) -> torch.Tensor:
        """A metric (the loss) averaged over dp ranks; not counted as training communication."""
        if not self.ctx.dims.dp_enabled:
            return value
        value = value.detach().clone()
        dist.all_reduce(value, group=self.ctx.dp_group)
        return value / self.ctx.dp_size

    # --- accounting ----------------------------------------------------------------------------
    def theoretical_bytes(self, micro_batch: int, block: int, grad_accum: int, activation_bytes: int) -> dict:
        """Per step, what this rank should send by collective kind, from the shapes alone."""
        payload: dict[str, float] = {}
        sent: dict[str, float] = {}

        def add(kind: str, nbytes: float, n: int, is_root: bool = False) -> None:
            if n > 1:
                payload[kind] = payload.get(kind, 0) + nbytes
                sent[kind] = sent.get(kind, 0) + sent_bytes(kind, nbytes, n, is_root)

        cfg, n_tp = self.model.config, self.ctx.tp_size
        if n_tp > 1:
            act = micro_batch * block * cfg.n_embd * activation_bytes
            # Forward: embedding + two per block; backward: two per block + the head's input.
            per_micro = 2 * (2 * cfg.n_layer + 1) * act + 3 * micro_batch * block * 4  # + the loss's three
            add("all_reduce", per_micro * grad_accum + 4, n_tp)  # + the clip norm's partial sum
        self.data_parallel_bytes(add, grad_accum)
        return {"payload_bytes": payload, "sent_bytes": sent}

    def data_parallel_bytes(self, add, grad_accum: int) -> None:
        """This strategy's collectives per step, through `add(kind, payload_bytes, ranks, is_root)`."""

    def param_numel(self) -> dict[str, int]:
        return {n: p.numel() for n, p in self.model.named_parameters()}

    def grad_bytes(self) -> int:
        return sum(self.param_numel().values()) * next(self.model.parameters()).element_size()


class SingleDevice(DataParallelStrategy):
    """No data parallelism: one replica on one device."""
    name = "none"
    multi_process = False
    data_parallel = False


class TensorParallel(SingleDevice):
    """Pure tensor parallelism: every rank holds a slice of the one replica, so no gradients are combined
    (the tensor-parallel layers communicate inside forward and backward)."""
    name = "tp"
    multi_process = True


class DistributedDataParallel(DataParallelStrategy):
    """torch DDP: bucketed all-reduce overlapping backward."""
    name = "ddp"
    comm_time_is_exposed_wait = True

    def wrap(self, module, param_dtype, cpu_offload):
        self.wrapped = apply_ddp(module, self.ctx.dp_group, self.ctx.device, self.meter)
        return self.wrapped, module

    def gradient_sync(self, sync: bool):
        return contextlib.nullcontext() if sync else self.wrapped.no_sync()

    def after_backward(self, backward_end: float) -> None:
        self.meter.exposed_seconds += ddp_exposed_wait(self.wrapped, backward_end)

    def data_parallel_bytes(self, add, grad_accum):
        add("all_reduce", self.grad_bytes(), self.ctx.dp_size)


class FullyShardedDataParallel(DataParallelStrategy):
    """torch FSDP2: parameters, gradients and optimizer state sharded over the dp ranks."""
    name = "fsdp"
    shards_parameters = True

    def wrap(self, module, param_dtype, cpu_offload):
        from parallel.fsdp import apply_fsdp  # imported by the one strategy that needs it (slow)
        self.wrapped = apply_fsdp(module, self.model.transformer.h, self.ctx.mesh["dp"], self.meter, param_dtype,
                                  cpu_offload)
        return self.wrapped, self.wrapped

    def gradient_sync(self, sync: bool):
        self.wrapped.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()

    def after_evaluation(self) -> None:
        """FSDP2 leaves the root's parameters gathered after a forward without backward; put the shards
        back, so the parameters are again the ones the optimizer holds."""
        from torch.distributed.fsdp import FSDPModule
        for module in self.wrapped.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    def param_numel(self) -> dict[str, int]:
        # Pre-FSDP sizes: the tensor-parallel slices each FSDP group shards.
        return {n: (p.to_local().numel() * self.ctx.dp_size if is_dtensor(p) else p.numel())
                for n, p in self.model.named_parameters()}

    def data_parallel_bytes(self, add, grad_accum):
        numel, elem = self.param_numel(), next(self.model.parameters()).element_size()
        grad_bytes = sum(numel.values()) * elem
        root = sum(v for n, v in numel.items() if not n.startswith("transformer.h.")) * elem
        # Blocks are gathered in forward and again in backward; the root stays gathered between them.
        add("all_gather", (2 * (grad_bytes - root) + root) * grad_accum, self.ctx.dp_size)
        add("reduce_scatter", grad_bytes, self.ctx.dp_size)
        if self.ctx.dims.tp_enabled:
            add("all_reduce", 4, self.ctx.dp_size)  # the clip norm


class ManualStrategy(DataParallelStrategy):
    """The teaching strategies: gradients combined after backward, timed between barriers since nothing
    overlaps them."""
    comm_time_is_exposed_wait = True
    composes_with_tensor_parallel = False

    def sync_gradients(self) -> None:
        group = self.ctx.dp_group
        dist.barrier(group=group)  # waiting for a slower rank is not communication
        t0 = time.perf_counter()
        self.combine(list(self.model.parameters()), group)
        self.meter.exposed_seconds += time.perf_counter() - t0

    def combine(self, params: list[nn.Parameter], group) -> None:
        raise NotImplementedError


class AllReduce(ManualStrategy):
    """One all-reduce per parameter after backward."""
    name = "allreduce"

    def combine(self, params, group):
        allreduce_gradients(params, group, self.meter)

    def data_parallel_bytes(self, add, grad_accum):
        add("all_reduce", self.grad_bytes(), self.ctx.dp_size)


class GatherScatter(ManualStrategy):
    """Every gradient gathered to the first rank, averaged there and scattered back."""
    name = "gather-scatter"

    def combine(self, params, group):
        gather_scatter_gradients(params, group, self.meter)

    def data_parallel_bytes(self, add, grad_accum):
        elem = next(self.model.parameters()).element_size()
        is_root = self.ctx.dp_rank == 0
        for numel in self.param_numel().values():
            add("gather", numel * elem, self.ctx.dp_size, is_root)
            add("scatter", numel * elem, self.ctx.dp_size, is_root)


class DataParallel(DataParallelStrategy):
    """torch.nn.DataParallel: one process splits each batch over every visible CUDA device."""
    name = "dp"
    multi_process = False
    blocks_run_in_calling_thread = False

    def wrap(self, module, param_dtype, cpu_offload):
        wrapped = MeanOverReplicas(replicate_with_data_parallel(module, self.ctx.device))
        return wrapped, module


class MeanOverReplicas(nn.Module):
    """nn.DataParallel gathers one mean loss per replica; the step needs the whole batch's, so each replica's
    loss is weighted by the rows it got (DataParallel splits the batch as `chunk` over its devices)."""

    def __init__(self, replicated: nn.Module):
        super().__init__()
        self.replicated = replicated

    def forward(self, idx, targets=None):
        logits, loss = self.replicated(idx, targets)
        if loss is None:
            return logits, None
        rows = torch.tensor([len(c) for c in idx.chunk(len(self.replicated.device_ids))], device=loss.device)
        return logits, (loss * rows).sum() / rows.sum()


# Every --parallel mode, in the order the help lists them.
STRATEGIES: dict[str, type[DataParallelStrategy]] = {
    cls.name: cls for cls in (SingleDevice, DistributedDataParallel, FullyShardedDataParallel, AllReduce,
                              GatherScatter, DataParallel, TensorParallel)}
