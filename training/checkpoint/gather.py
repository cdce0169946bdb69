"""A run's state gathered across layouts: consolidated to full tensors under the single-device names when a
checkpoint is written (whatever layout trained it), and sharded back for this run's layout when it resumes.  Every
function here is a collective under a parallel layout: all ranks call it, in the same order."""
from __future__ import annotations

import torch

from parallel.comms import counted_all_gather
from parallel.errors import ParallelError
from parallel.local_state import is_dtensor

# The optimizer file's layout: the state keyed by single-device parameter name, full tensors.
OPTIMIZER_FORMAT = "full-by-name"


def full_tensor(par, name: str, t: torch.Tensor) -> torch.Tensor:
    """The single-device tensor for parameter `name` (or its optimizer state); a collective."""
    if is_dtensor(t):
        t = t.full_tensor()
    spec = par.layout.get(name)
    if spec is not None and par.ctx.dims.tp_enabled:
        t = spec.unshard(counted_all_gather(t.detach(), par.ctx.tp_group, None))
    return t.detach().cpu()


def local_tensor(par, name: str, full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's piece of the single-device tensor `full`, laid out like the parameter `like`."""
    spec = par.layout.get(name)
    if spec is not None and par.ctx.dims.tp_enabled:
        full = spec.shard(full, par.ctx.tp_rank, par.ctx.tp_size)
    if is_dtensor(like):
        from torch.distributed.tensor import distribute_tensor
        return distribute_tensor(full.to(like.device), like.device_mesh, like.placements)
    return full.to(like.device)


def full_model_state(par, keep: bool = True) -> dict[str, torch.Tensor]:
    """Every parameter as one full tensor under its single-device name (all ranks must call).  A rank that does not
    `keep` them (one that will not write them) takes part in each gathering and drops its result at once, so that it
    never holds more than one full tensor: at GPT-2 Medium on four ranks, every rank holding the whole consolidated
    state (with the optimizer's) ran the shared CPU host out of memory (bench/REPORT.md, "Stopping GPT-2 Medium")."""
    state = {}
    for name, p in par.model.named_parameters():
        full = full_tensor(par, name, p)
        if keep:
            state[name] = full
    return state


def full_optimizer_state(par, optimizer: torch.optim.Optimizer, keep: bool = True) -> dict:
    """The optimizer state keyed by single-device parameter names, with full tensors, so that a run can
    resume under any other layout (all ranks must call; `keep` as in `full_model_state`: without it, the state
    holds no entries)."""
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
            if keep:
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
