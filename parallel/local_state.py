"""What a rank holds of the parallelised model: whether a tensor is a DTensor (FSDP's and torch TP's shards),
and the bytes of parameters, gradients and optimizer state this rank keeps.  Consolidating that state for a
checkpoint is training's (training/checkpoint/gather.py)."""
from __future__ import annotations

import sys

import torch


def is_dtensor(t) -> bool:
    """Whether `t` is a DTensor, without importing torch.distributed.tensor (slow to import) into the processes that
    never shard anything: until FSDP or torch's TP has imported it, no tensor can be one."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Parameter, gradient and optimizer-state bytes this rank holds (its shards only).  A gradient has
    its parameter's shape and placement, so it is counted from the parameter: the figure is the same
    between steps, when the gradients have been freed."""
    local = lambda t: t.to_local() if is_dtensor(t) else t
    size = lambda t: local(t).numel() * local(t).element_size()
    params = [p for p in model.parameters() if p.requires_grad]
    return {"params": sum(size(p) for p in model.parameters()),
            "grads": sum(size(p) for p in params),
            "optimizer": sum(size(v) for st in optimizer.state.values() for v in st.values()
                             if torch.is_tensor(v) and v.dim() > 0)}
