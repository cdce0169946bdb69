"""Wanda (Sun et al., 2023, "A Simple and Effective Pruning Approach for Large Language Models").

Score of weight W[i, j] = |W[i, j]| * ||X_j||_2, where ||X_j|| is the L2 norm of input
feature j over a few calibration batches.  As in the paper, weights compete within
each output row (every row of every layer loses the same share), which is what makes
the method work without retraining.
"""
from __future__ import annotations

import torch

from model.gpt import GPT
from prune.errors import PruneError
from prune.masks import MaskSet


@torch.no_grad()
def input_feature_norms(model: GPT, params: dict[str, torch.nn.Parameter], batches, device) -> dict[str, torch.Tensor]:
    """||X_j||_2 over every calibration token, for the input of each pruned linear layer."""
    modules = dict(model.named_modules())
    sums: dict[str, torch.Tensor] = {}
    hooks = []
    for name in params:
        module_name, _, attr = name.rpartition(".")
        module = modules[module_name]
        if attr != "weight" or not isinstance(module, torch.nn.Linear):
            raise PruneError(f"wanda needs input activations, so it prunes linear weights only; {name} is not one "
                             f"(use --prune-params linear)")

        def accumulate(mod, inputs, output, name=name):
            x = inputs[0].detach().float().reshape(-1, inputs[0].size(-1))
            sums[name] = sums.get(name, 0) + (x * x).sum(0)

        hooks.append(module.register_forward_hook(accumulate))
    was_training = model.training
    model.eval()
    try:
        for x, _ in batches:
            model(x.to(device))
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return {name: s.sqrt() for name, s in sums.items()}


@torch.no_grad()
def wanda_masks(params: dict[str, torch.nn.Parameter], norms: dict[str, torch.Tensor], sparsity: float,
                previous: MaskSet | None = None) -> MaskSet:
    """Per tensor, exactly round(sparsity * numel) weights are pruned, spread evenly over the output rows.

    Each row loses floor(k / rows); the k mod rows leftover cuts go to the rows whose next
    candidate scores lowest.  Entries pruned earlier rank below everything, so masks only grow.
    """
    masks = {}
    for name, p in params.items():
        score = p.detach().abs().float() * norms[name][None, :]
        if previous is not None:
            score = torch.where(previous.masks[name], score, torch.full_like(score, -1.0))
        rows, cols = score.shape
        n_prune = round(sparsity * score.numel())
        per_row, extra = divmod(n_prune, rows)
        order = torch.sort(score, dim=1, stable=True).indices
        counts = torch.full((rows,), per_row, device=score.device)
        if extra:
            next_scores = score.gather(1, order[:, per_row:per_row + 1]).squeeze(1)
            counts[torch.sort(next_scores, stable=True).indices[:extra]] += 1
        prune_sorted = torch.arange(cols, device=score.device)[None, :] < counts[:, None]
        keep = torch.ones_like(score, dtype=torch.bool)
        keep.scatter_(1, order, ~prune_sorted)
        if previous is not None:
            # A row whose leftover cut moved elsewhere must still not revive a weight pruned earlier.
            keep &= previous.masks[name]
        masks[name] = keep
    return MaskSet(params, masks)
