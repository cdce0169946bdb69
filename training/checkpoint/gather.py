"""A run's state gathered across layouts: consolidated to full tensors under the single-device names when a
checkpoint is written (whatever layout trained it), and sharded back for this run's layout when it resumes.  Every
function here is a collective under a parallel layout: all ranks call it, in the same order."""
from __future__ import annotations

import torch
import torch.distributed as dist

from parallel.errors import ParallelError
from parallel.local_state import is_dtensor

# The optimizer file's layout: the state keyed by single-device parameter name, full tensors.
OPTIMIZER_FORMAT = "full-by-name"


def gathered_to(group, t: torch.Tensor, rows: int | None = None) -> list[torch.Tensor] | None:
    """Every rank's `t` in rank order on the group's first rank (None on the others): a gather, not an all-gather, so
    that only the rank that writes receives (a quarter of an all-gather's traffic on four ranks, and no full-size
    buffers on the others: at GPT-2 Medium the all-gathers were over a third of a save on a busy host,
    bench/by_hand.md).  Shards may be
    uneven (`rows`: the largest's rows; the smaller ones are padded to it and cut back after)."""
    n = dist.get_world_size(group)
    if n == 1:
        return [t]
    t = t.detach().contiguous()
    if rows is not None and t.size(0) < rows:
        t = torch.cat([t, t.new_zeros(rows - t.size(0), *t.shape[1:])])
    root = dist.get_group_rank(group, dist.get_rank()) == 0
    out = [torch.empty_like(t) for _ in range(n)] if root else None
    dist.gather(t, out, group=group, group_dst=0)
    return out


def _fsdp_full_on_root(t) -> torch.Tensor | None:
    """The full tensor of an FSDP parameter (or its optimizer state) on its data-parallel group's first rank."""
    from torch.distributed.tensor import Shard
    if len(t.placements) != 1 or t.placements[0] != Shard(0):  # FSDP2 shards dim 0; anything else: torch's own way
        full = t.full_tensor()
        return full if dist.get_group_rank(t.device_mesh.get_group(), dist.get_rank()) == 0 else None
    n = t.device_mesh.size()
    rows = -(-t.shape[0] // n)  # torch.chunk's split, as FSDP2 cuts dim 0
    pieces = gathered_to(t.device_mesh.get_group(), t.to_local(), rows)
    return None if pieces is None else torch.cat(pieces)[:t.shape[0]]


def full_tensor(par, name: str, t: torch.Tensor) -> torch.Tensor | None:
    """The single-device tensor for parameter `name` (or its optimizer state) on the writing rank, None on the others;
    a collective every rank calls."""
    if is_dtensor(t):
        t = _fsdp_full_on_root(t)
    spec = par.layout.get(name)
    if spec is not None and par.ctx.dims.tp_enabled:
        # Only the writer's tensor-parallel group gathers on: the others hold copies of what it holds.
        if par.ctx.dp_rank != 0:
            return None
        shards = gathered_to(par.ctx.tp_group, t)
        t = None if shards is None else spec.unshard(shards)
    return None if t is None or not par.ctx.is_writer else t.detach().cpu()


def local_tensor(par, name: str, full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's piece of the single-device tensor `full`, laid out like the parameter `like`."""
    spec = par.layout.get(name)
    if spec is not None and par.ctx.dims.tp_enabled:
        full = spec.shard(full, par.ctx.tp_rank, par.ctx.tp_size)
    if is_dtensor(like):
        from torch.distributed.tensor import distribute_tensor
        return distribute_tensor(full.to(like.device), like.device_mesh, like.placements)
    return full.to(like.device)


def full_model_state(par) -> dict[str, torch.Tensor]:
    """Every parameter as one full tensor under its single-device name, on the writing rank; empty on the others,
    which take part in each gathering and receive nothing: at GPT-2 Medium on four ranks, every rank holding the
    whole consolidated state (with the optimizer's) ran the shared CPU host out of memory (bench/REPORT.md,
    "Stopping GPT-2 Medium")."""
    gathered = ((name, full_tensor(par, name, p)) for name, p in par.model.named_parameters())
    return {name: full for name, full in gathered if full is not None}


def full_optimizer_state(par, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer state keyed by single-device parameter names, with full tensors, so that a run can
    resume under any other layout (all ranks must call; as in `full_model_state`, only the writer's holds
    entries)."""
    names = {id(p): n for n, p in par.model.named_parameters()}
    state, groups = {}, []
    for group in optimizer.param_groups:
        groups.append({**{k: v for k, v in group.items() if k != "params"},
                       "params": [names[id(p)] for p in group["params"]]})
        for p in group["params"]:
            name = names[id(p)]
            entry = {k: (full_tensor(par, name, v) if torch.is_tensor(v) and v.dim() > 0
                         else v.cpu() if torch.is_tensor(v) else v)
                     for k, v in optimizer.state.get(p, {}).items()}
            if par.ctx.is_writer:
                state[name] = entry
    return {"format": OPTIMIZER_FORMAT, "state": state, "param_groups": groups}


def load_optimizer_state(par, optimizer: torch.optim.Optimizer, saved: dict) -> None:
    if not isinstance(saved, dict) or saved.get("format") != OPTIMIZER_FORMAT:
        raise ParallelError("the checkpoint's optimizer state is not in the consolidated by-name format; "
                            "it was written by an older train.py and can only be resumed with --parallel none")
    names = {id(p): n for n, p in par.model.named_parameters()}
    params = dict(par.model.named_parameters())
    torch_state, torch_groups, index = {}, [], 0
    for group, saved_group in zip(optimizer.param_groups, saved["param_groups"], strict=True):
        current = [names[id(p)] for p in group["params"]]
        if current != saved_group["params"]:
            raise ParallelError("the checkpoint's optimizer groups do not match this model's parameters")
        ids = []
        for name in current:
            entry = saved["state"].get(name)
            if entry:
                torch_state[index] = {k: (local_tensor(par, name, v, params[name]) if torch.is_tensor(v) and
                                          v.dim() > 0 else v) for k, v in entry.items()}
            ids.append(index)
            index += 1
        torch_groups.append({**{k: v for k, v in saved_group.items() if k != "params"}, "params": ids})
    optimizer.load_state_dict({"state": torch_state, "param_groups": torch_groups})
