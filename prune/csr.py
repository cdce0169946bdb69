"""An inference copy of a masked model whose block linear layers hold their weights in sparse CSR format.

Used only to measure whether unstructured sparsity buys real speed on this device:
a dense matmul over a weight that is 80% zeros costs exactly as much as over a dense one.  Where the device's
sparse kernels lack the weights' dtype (torch's CPU CSR matmul, MKL's, has float32 and float64 only), the CSR
copy computes in float32, converting each layer's input and output, and the report says so.
"""
from __future__ import annotations

import copy
import functools

import torch
import torch.nn as nn

from model.gpt import GPT


@functools.cache
def sparse_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """`dtype` if this device's CSR matmul has it (tried once on a 2x2 matrix), else float32."""
    probe = torch.eye(2, dtype=dtype, device=device).to_sparse_csr()
    try:
        torch.sparse.mm(probe, torch.ones(2, 1, dtype=dtype, device=device))
    except (NotImplementedError, RuntimeError):  # "... not implemented for 'Half'"
        return torch.float32
    return dtype


def csr_dtype(model: GPT) -> torch.dtype:
    """The dtype `csr_copy(model)` computes in."""
    weight = model.transformer.wte.weight
    return sparse_dtype(weight.dtype, weight.device)


class CsrLinear(nn.Module):
    traceable = False  # TorchScript's tracer cannot record torch.sparse.mm over a CSR weight: decoded eagerly

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach()
        self.compute_dtype = sparse_dtype(weight.dtype, weight.device)
        self.weight = weight.to(self.compute_dtype).to_sparse_csr()
        self.bias = None if linear.bias is None else linear.bias.detach().to(self.compute_dtype, copy=True)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.compute_dtype)
        y = torch.sparse.mm(self.weight, flat.t()).t()
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def csr_copy(model: GPT) -> GPT:
    """A deep copy of `model` with each block's c_attn, c_proj, c_fc and c_proj in CSR (for inference only)."""
    sparse = copy.deepcopy(model).eval()
    for block in sparse.transformer.h:
        for parent, attr in ((block.attn, "c_attn"), (block.attn, "c_proj"), (block.mlp, "c_fc"), (block.mlp, "c_proj")):
            setattr(parent, attr, CsrLinear(getattr(parent, attr)))
    return sparse
