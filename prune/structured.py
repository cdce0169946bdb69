"""Row pruning: remove whole MLP hidden units and attention heads, then rebuild smaller dense layers.

A hidden unit j of a block is row j of `mlp.c_fc` (weight and bias) and column j of
`mlp.c_proj`; a head h is its rows in each of the q, k and v blocks of the fused
`attn.c_attn` and its columns of `attn.c_proj`.  Removing them gives a model whose
config records the remaining widths per layer (`mlp_hidden`, `n_head_per_layer`), so
it really computes less and loads through `storage.artifact.load_model`.

Units are ranked within each layer (every layer keeps the same share), by
||input rows||_2 * ||output columns||_2: a unit with a tiny output column contributes
little however large its input row, and the product does not depend on how the two
matrices happen to be scaled relative to each other.
"""
from __future__ import annotations

import dataclasses

import torch

from model.config import GPTConfig
from model.gpt import GPT
from runtime.errors import UserError
from storage.weights import model_from_weights


class StructureError(UserError, ValueError):
    pass


def kept_width(width: int, sparsity: float) -> int:
    """Units left after removing `sparsity` of `width` (rounded half up)."""
    return int(width * (1 - sparsity) + 0.5)


def check_widths(config: GPTConfig, sparsity: float) -> None:
    """Refuse a target that would leave some layer with no head or no hidden unit."""
    for layer in range(config.n_layer):
        for what, width in (("head", config.layer_n_head(layer)), ("MLP hidden unit", config.layer_mlp_hidden(layer))):
            if kept_width(width, sparsity) == 0:
                raise StructureError(
                    f"--target {sparsity} would remove every {what} of layer {layer} ({width} -> 0); row pruning "
                    f"keeps at least one per layer, so use --target at most {1 - 0.5 / width:.4g}")


def head_rows(head: torch.Tensor, n_head: int, head_dim: int) -> torch.Tensor:
    """Rows of the fused [q | k | v] projection that belong to the given heads (in q, k, v order)."""
    width = n_head * head_dim
    offsets = (head[:, None] * head_dim + torch.arange(head_dim, device=head.device)[None, :]).flatten()
    return torch.cat([offsets + part * width for part in range(3)])


def head_columns(head: torch.Tensor, head_dim: int) -> torch.Tensor:
    return (head[:, None] * head_dim + torch.arange(head_dim, device=head.device)[None, :]).flatten()


@torch.no_grad()
def unit_scores(model: GPT) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer: a score per MLP hidden unit and a score per head (higher = more important)."""
    hidden_scores, head_scores = [], []
    hd = model.config.head_dim
    for block in model.transformer.h:
        fc_in = block.mlp.c_fc.weight.float().norm(dim=1)
        fc_out = block.mlp.c_proj.weight.float().norm(dim=0)
        hidden_scores.append(fc_in * fc_out)
        n_head = block.attn.n_head
        qkv = block.attn.c_attn.weight.float().view(3, n_head, hd, -1)
        attn_in = qkv.pow(2).sum(dim=(0, 2, 3)).sqrt()
        attn_out = block.attn.c_proj.weight.float().view(-1, n_head, hd).pow(2).sum(dim=(0, 2)).sqrt()
        head_scores.append(attn_in * attn_out)
    return hidden_scores, head_scores


def select_units(model: GPT, sparsity: float, reference: GPTConfig) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Indices (ascending) of the hidden units and heads to keep so each layer holds
    kept_width(reference width, sparsity) of them; `reference` holds the widths before the first round."""
    check_widths(reference, sparsity)
    hidden_scores, head_scores = unit_scores(model)
    keep_hidden, keep_heads = [], []
    for layer in range(reference.n_layer):
        for scores, width, out in ((hidden_scores[layer], reference.layer_mlp_hidden(layer), keep_hidden),
                                   (head_scores[layer], reference.layer_n_head(layer), keep_heads)):
            n_keep = min(kept_width(width, sparsity), len(scores))
            out.append(torch.topk(scores, n_keep, sorted=False).indices.sort().values)
    return keep_hidden, keep_heads


@torch.no_grad()
def shrink(model: GPT, keep_hidden: list[torch.Tensor], keep_heads: list[torch.Tensor]) -> GPT:
    """A new, smaller GPT holding only the kept hidden units and heads of `model` (which is left unchanged)."""
    config = dataclasses.replace(model.config, mlp_hidden=[len(k) for k in keep_hidden],
                                 n_head_per_layer=[len(k) for k in keep_heads])
    hd = config.head_dim
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    for layer, block in enumerate(model.transformer.h):
        prefix = f"transformer.h.{layer}."
        hidden = keep_hidden[layer].to(state[prefix + "mlp.c_fc.weight"].device)
        heads = keep_heads[layer].to(hidden.device)
        rows = head_rows(heads, block.attn.n_head, hd)
        cols = head_columns(heads, hd)
        slices = {"mlp.c_fc.weight": (0, hidden), "mlp.c_fc.bias": (0, hidden), "mlp.c_proj.weight": (1, hidden),
                  "attn.c_attn.weight": (0, rows), "attn.c_attn.bias": (0, rows), "attn.c_proj.weight": (1, cols)}
        for name, (dim, index) in slices.items():
            if prefix + name in state:  # biases are absent with bias=False
                state[prefix + name] = state[prefix + name].index_select(dim, index).contiguous()
    smaller = model_from_weights(config, state, "the shrunk weights")
    smaller.train(model.training)
    smaller.gradient_checkpointing = model.gradient_checkpointing
    return smaller
