"""Global unstructured magnitude pruning: the smallest |w| across all pruned tensors go first."""
from __future__ import annotations

import torch

from prune.masks import MaskSet


@torch.no_grad()
def magnitude_masks(params: dict[str, torch.nn.Parameter], sparsity: float,
                    previous: MaskSet | None = None) -> MaskSet:
    """Masks that prune exactly round(sparsity * total) entries, ranked globally by magnitude.

    Entries pruned in an earlier round rank below everything else, so masks only grow.
    Ties are broken by position (a stable sort), so the count is exact even when many
    weights share a magnitude.
    """
    names = list(params)
    scores = []
    for name in names:
        score = params[name].detach().abs().float().flatten()
        if previous is not None:
            score = torch.where(previous.masks[name].flatten(), score, torch.full_like(score, -1.0))
        scores.append(score)
    flat = torch.cat(scores)
    n_prune = round(sparsity * flat.numel())
    keep = torch.ones(flat.numel(), dtype=torch.bool, device=flat.device)
    if n_prune:
        order = torch.sort(flat, stable=True).indices
        keep[order[:n_prune]] = False
    masks, offset = {}, 0
    for name in names:
        n = params[name].numel()
        masks[name] = keep[offset:offset + n].view_as(params[name])
        offset += n
    return MaskSet(params, masks)
