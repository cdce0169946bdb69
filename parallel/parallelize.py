"""One entry point: take the full single-device GPT and a `DistContext`, return it parallelised.

Order (as torchtitan): tensor parallelism first, then data parallelism (DDP or FSDP) over the
remaining mesh dimension.  The returned `ParallelModel` also knows how to synchronise gradients in
the manual modes, clip with a correct global norm, consolidate the model and optimizer state to
full tensors under the single-device names, and shard such a state back for any layout.
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor

from model.gpt import GPT
from parallel.comms import CommsMeter, counted_all_gather, counted_all_reduce, sent_bytes
from parallel.data_parallel import (allreduce_gradients, apply_data_parallel, apply_ddp, apply_fsdp,
                                    ddp_exposed_wait, gather_scatter_gradients)
from parallel.distributed import DistContext, ParallelError
from parallel.tensor_parallel import ShardSpec, apply_tensor_parallel

OPTIMIZER_FORMAT = "full-by-name"


class ParallelModel:
    def __init__(self, ctx: DistContext, model: GPT, module: nn.Module, eval_module: nn.Module,
                 meter: CommsMeter, layout: dict[str, ShardSpec], data_parallel: str, note: str):
        self.ctx, self.model, self.module, self.eval_module = ctx, model, module, eval_module
        self.meter, self.layout, self.data_parallel, self.note = meter, layout, data_parallel, note

    @property
    def is_distributed(self) -> bool:
        return self.ctx.mode != "none"

    @property
    def comm_time_is_exposed_wait(self) -> bool:
        return self.data_parallel in ("ddp", "allreduce", "gather-scatter")

    def after_evaluation(self) -> None:
        """FSDP2 leaves the root's parameters gathered after a forward without backward; put the shards
        back, so the parameters are again the ones the optimizer holds."""
        if self.data_parallel == "fsdp":
            for module in self.module.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()

    # --- the training step ---------------------------------------------------------------------
    def gradient_sync(self, sync: bool):
        """Context for one micro-batch's backward: with `sync=False` DDP/FSDP skip the reduction
        (gradient accumulation); the manual modes always reduce after the last micro-batch."""
        if self.data_parallel == "ddp" and not sync:
            return self.module.no_sync()
        if self.data_parallel == "fsdp":
            self.module.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()

    def after_backward(self, backward_end: float) -> None:
        if self.data_parallel == "ddp":
            self.meter.exposed_seconds += ddp_exposed_wait(self.module, backward_end)

    def sync_gradients(self) -> None:
        """The manual strategies: timed between barriers, as nothing overlaps them."""
        if self.data_parallel not in ("allreduce", "gather-scatter"):
            return
        group = self.ctx.dp_group
        dist.barrier(group=group)  # waiting for a slower rank is not communication
        t0 = time.perf_counter()
        params = list(self.model.parameters())
        if self.data_parallel == "allreduce":
            allreduce_gradients(params, group, self.meter)
        else:
            gather_scatter_gradients(params, group, self.meter)
        self.meter.exposed_seconds += time.perf_counter() - t0

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Global gradient norm and clipping: tensor-parallel shards summed over the tp group,
        replicated parameters counted once, FSDP shards summed over the dp group."""
        if not self.layout:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
            return norm.full_tensor() if isinstance(norm, DTensor) else norm
        device = self.ctx.device
        sharded, replicated = torch.zeros((), device=device), torch.zeros((), device=device)
        grads = []
        for name, p in self.model.named_parameters():
            if p.grad is None:
                continue
            grads.append(p.grad)
            local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            square = local.detach().float().pow(2).sum().to(device)
            if name in self.layout:
                sharded += square
            else:
                replicated += square
        total = counted_all_reduce(sharded, self.ctx.tp_group, self.meter) + replicated
        if self.data_parallel == "fsdp":
            total = counted_all_reduce(total, self.ctx.dp_group, self.meter)
        norm = total.sqrt()
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.device))
        return norm

    def mean_over_data_parallel(self, value: torch.Tensor) -> torch.Tensor:
        """A metric (the loss) averaged over dp ranks; not counted as training communication."""
        if self.ctx.dp_size == 1:
            return value
        value = value.detach().clone()
        dist.all_reduce(value, group=self.ctx.dp_group)
        return value / self.ctx.dp_size

    # --- consolidated state --------------------------------------------------------------------
    def full_tensor(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """The single-device tensor for parameter `name` (or its optimizer state); a collective."""
        if isinstance(t, DTensor):
            t = t.full_tensor()
        spec = self.layout.get(name)
        if spec is not None and self.ctx.tp_size > 1:
            t = spec.unshard(counted_all_gather(t.detach(), self.ctx.tp_group, None))
        return t.detach().cpu()

    def local_tensor(self, name: str, full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """This rank's piece of the single-device tensor `full`, laid out like the parameter `like`."""
        spec = self.layout.get(name)
        if spec is not None and self.ctx.tp_size > 1:
            full = spec.shard(full, self.ctx.tp_rank, self.ctx.tp_size)
        if isinstance(like, DTensor):
            return distribute_tensor(full.to(like.device), like.device_mesh, like.placements)
        return full.to(like.device)

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """Every parameter as one full tensor under its single-device name (all ranks must call)."""
        return {name: self.full_tensor(name, p) for name, p in self.model.named_parameters()}

    def full_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The optimizer state keyed by single-device parameter names, with full tensors, so that a run
        can resume under any other layout."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        state, groups = {}, []
        for group in optimizer.param_groups:
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": [names[id(p)] for p in group["params"]]})
            for p in group["params"]:
                name = names[id(p)]
                state[name] = {k: (self.full_tensor(name, v) if torch.is_tensor(v) and v.dim() > 0
                                   else v.cpu() if torch.is_tensor(v) else v)
                               for k, v in optimizer.state.get(p, {}).items()}
        return {"format": OPTIMIZER_FORMAT, "state": state, "param_groups": groups}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, saved: dict) -> None:
        if saved.get("format") != OPTIMIZER_FORMAT:
            raise ParallelError("the checkpoint's optimizer state is not in the consolidated by-name format; "
                                "it was written by an older train.py and can only be resumed with --parallel none")
        names = {id(p): n for n, p in self.model.named_parameters()}
        params = dict(self.model.named_parameters())
        torch_state, torch_groups, index = {}, [], 0
        for group, saved_group in zip(optimizer.param_groups, saved["param_groups"], strict=True):
            current = [names[id(p)] for p in group["params"]]
            if current != saved_group["params"]:
                raise ParallelError("the checkpoint's optimizer groups do not match this model's parameters")
            ids = []
            for name in current:
                entry = saved["state"].get(name)
                if entry:
                    torch_state[index] = {k: (self.local_tensor(name, v, params[name]) if torch.is_tensor(v) and
                                              v.dim() > 0 else v) for k, v in entry.items()}
                ids.append(index)
                index += 1
            torch_groups.append({**{k: v for k, v in saved_group.items() if k != "params"}, "params": ids})
        optimizer.load_state_dict({"state": torch_state, "param_groups": torch_groups})

    # --- accounting ----------------------------------------------------------------------------
    def local_state_bytes(self, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """Parameter, gradient and optimizer-state bytes this rank holds (its shards only)."""
        local = lambda t: t.to_local() if isinstance(t, DTensor) else t
        size = lambda t: local(t).numel() * local(t).element_size()
        params = list(self.model.parameters())
        return {"params": sum(size(p) for p in params),
                "grads": sum(size(p.grad) for p in params if p.grad is not None),
                "optimizer": sum(size(v) for st in optimizer.state.values() for v in st.values()
                                 if torch.is_tensor(v) and v.dim() > 0)}

    def theoretical_bytes(self, micro_batch: int, block: int, grad_accum: int, activation_bytes: int) -> dict:
        """Per step, what this rank should send by collective kind, from the shapes alone."""
        ctx, cfg = self.ctx, self.model.config
        if self.data_parallel == "fsdp":
            # Pre-FSDP sizes: the tensor-parallel slices each FSDP group shards.
            param_numel = {n: (p.to_local().numel() * ctx.dp_size if isinstance(p, DTensor) else p.numel())
                           for n, p in self.model.named_parameters()}
        else:
            param_numel = {n: p.numel() for n, p in self.model.named_parameters()}
        elem = next(self.model.parameters()).element_size()
        grad_bytes = sum(param_numel.values()) * elem
        payload: dict[str, float] = {}
        sent: dict[str, float] = {}

        def add(kind, p, n, is_root=False):
            if n > 1:
                payload[kind] = payload.get(kind, 0) + p
                sent[kind] = sent.get(kind, 0) + sent_bytes(kind, p, n, is_root)

        n_dp, n_tp = ctx.dp_size, ctx.tp_size
        if n_tp > 1:
            act = micro_batch * block * cfg.n_embd * activation_bytes
            # Forward: embedding + two per block; backward: two per block + the head's input.
            per_micro = 2 * (2 * cfg.n_layer + 1) * act + 3 * micro_batch * block * 4  # + the loss's three
            add("all_reduce", per_micro * grad_accum + 4, n_tp)  # + the clip norm's partial sum
        if self.data_parallel in ("ddp", "allreduce"):
            add("all_reduce", grad_bytes, n_dp)
        elif self.data_parallel == "gather-scatter":
            for numel in param_numel.values():
                add("gather", numel * elem, n_dp, ctx.dp_rank == 0)
                add("scatter", numel * elem, n_dp, ctx.dp_rank == 0)
        elif self.data_parallel == "fsdp":
            root = sum(v for n, v in param_numel.items() if not n.startswith("transformer.h.")) * elem
            blocks = grad_bytes - root
            # Blocks are gathered in forward and again in backward; the root stays gathered between them.
            add("all_gather", (2 * blocks + root) * grad_accum, n_dp)
            add("reduce_scatter", grad_bytes, n_dp)
            if n_tp > 1:
                add("all_reduce", 4, n_dp)  # the clip norm
        return {"payload_bytes": payload, "sent_bytes": sent}


def parallelize(model: GPT, ctx: DistContext, meter: CommsMeter, param_dtype: torch.dtype | None = None,
                cpu_offload: bool = False) -> ParallelModel:
    """Apply `ctx.mode` to the full model (same weights on every rank); returns the ParallelModel."""
    mode = ctx.mode
    if mode == "none":
        return ParallelModel(ctx, model, model, model, meter, {}, "none", "")
    if mode == "dp":
        wrapped = apply_data_parallel(model, ctx.device)
        return ParallelModel(ctx, model, wrapped, model, meter, {}, "dp", "")
    if cpu_offload and mode != "fsdp":
        raise ParallelError("--cpu-offload applies to --parallel fsdp only")
    module, layout, notes = model, {}, []
    if ctx.tp_size > 1:
        module = apply_tensor_parallel(model, ctx.tp_group, meter)
        layout = module.layout
    data_parallel = "tp" if mode == "tp" else mode
    if ctx.dp_size == 1 and mode in ("ddp", "fsdp", "allreduce", "gather-scatter"):
        # Nothing to communicate: the wrappers would only add copies and hooks.
        notes.append(f"one data-parallel rank: no {mode} wrapper applied (nothing to synchronise)")
        data_parallel = "none"
    eval_module = module
    if data_parallel == "ddp":
        module = apply_ddp(module, ctx.dp_group, ctx.device, meter)
    elif data_parallel == "fsdp":
        module = eval_module = apply_fsdp(module, ctx.mesh["dp"], meter, param_dtype, cpu_offload)
    return ParallelModel(ctx, model, module, eval_module, meter, layout, data_parallel, "; ".join(notes))
