"""Which tensors unstructured pruning may touch, the masks that keep pruned weights at zero, and exact counts.

Masks are enforced from outside the model: gradients of pruned weights are zeroed
before the optimizer step (so Adam's moments stay zero for them) and the weights
are multiplied by the mask after it (so neither the update nor weight decay can
revive them).  A pruned weight is therefore exactly 0.0 at every point a reader sees it.
"""
from __future__ import annotations

import torch

from model.gpt import GPT
from prune.errors import PruneError

# Groups of parameters that `--prune-params` may name.  `linear` is the default: the
# transformer blocks' linear weights (attention c_attn/c_proj, MLP c_fc/c_proj).
PARAM_GROUPS = ("linear", "bias", "layernorm", "embedding")


def parse_param_groups(spec: str) -> tuple[str, ...]:
    groups = tuple(g.strip() for g in spec.split(",") if g.strip())
    unknown = [g for g in groups if g not in PARAM_GROUPS]
    if unknown or not groups:
        raise PruneError(f"--prune-params {spec!r}: expected a comma-separated subset of {', '.join(PARAM_GROUPS)}")
    return groups


def param_group(name: str) -> str | None:
    """The group a parameter belongs to, or None for the output head (tied to the embedding)."""
    if name.startswith("lm_head."):
        return None
    if name.startswith(("transformer.wte.", "transformer.wpe.")):
        return "embedding"
    if ".ln_" in name or name.startswith("transformer.ln_f."):
        return "layernorm"
    if name.endswith(".bias"):
        return "bias"
    return "linear"


def prunable_parameters(model: GPT, groups: tuple[str, ...] = ("linear",)) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if param_group(n) in groups}


def block_linear_weights(model: GPT) -> dict[str, torch.nn.Parameter]:
    """The four weight matrices of every block: what every method prunes by default, and what row pruning shrinks."""
    return prunable_parameters(model, ("linear",))


class MaskSet:
    """One boolean keep-mask per pruned parameter (True = kept)."""

    def __init__(self, params: dict[str, torch.nn.Parameter], masks: dict[str, torch.Tensor]):
        if set(params) != set(masks):
            raise ValueError("masks and parameters name different tensors")
        self.params, self.masks = params, masks

    @torch.no_grad()
    def apply(self) -> None:
        for name, p in self.params.items():
            p.mul_(self.masks[name])

    @torch.no_grad()
    def mask_gradients(self) -> None:
        for name, p in self.params.items():
            if p.grad is not None:
                p.grad.mul_(self.masks[name])


@torch.no_grad()
def count_nonzero(tensors) -> tuple[int, int]:
    """(nonzero entries, total entries) over the tensors, each counted once even if shared."""
    seen, nonzero, total = set(), 0, 0
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        nonzero += int(torch.count_nonzero(t))
        total += t.numel()
    return nonzero, total
