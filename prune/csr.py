"""An inference copy of a masked model whose block linear layers hold their weights in sparse CSR format.

Used only to measure whether unstructured sparsity buys real speed on this device:
a dense matmul over a weight that is mostly zeros costs exactly as much as over a dense one.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from model.gpt import GPT


class CsrLinear(nn.Module):
    traceable = False  # TorchScript's tracer cannot record torch.sparse.mm over a CSR weight: decoded eagerly

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = linear.weight.detach().to_sparse_csr()
        self.bias = None if linear.bias is None else linear.bias.detach().clone()
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        y = torch.sparse.mm(self.weight, flat.t()).t()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def csr_copy(model: GPT) -> GPT:
    """A deep copy of `model` with each block's c_attn, c_proj, c_fc and c_proj in CSR (for inference only)."""
    sparse = copy.deepcopy(model).eval()
    for block in sparse.transformer.h:
        for parent, attr in ((block.attn, "c_attn"), (block.attn, "c_proj"), (block.mlp, "c_fc"), (block.mlp, "c_proj")):
            setattr(parent, attr, CsrLinear(getattr(parent, attr)))
    return sparse
