"""Hand-written Megatron-style tensor parallelism for the single-device GPT.

`apply_tensor_parallel(model, tp_group)` takes a full GPT built (or loaded) on every rank from the
same seed, or one built empty on the meta device (whose slices parallel/materialize.py fills after), and replaces, in place and in the order of `TP_PLAN`, each listed module by its parallel
counterpart holding only this rank's slice of the full weights, so the parallel model is the same
function as the single-device one.  Attention heads are split across ranks (the fused [q|k|v]
projection per head, not contiguously), the MLP is column- then row-parallel: one all-reduce per
sub-block forward and one backward.  The tied embedding / output head is vocabulary-parallel and the
cross-entropy is computed from the vocabulary shards, so no rank ever holds full logits in training.
LayerNorms, position embeddings and row-parallel biases stay replicated.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fnmatch import fnmatch

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from model.gpt import GPT
from model.kv_cache import KVCache
from parallel.comms import CommsMeter, counted_all_reduce
from parallel.mappings import (copy_to_tensor_parallel_region, gather_from_tensor_parallel_region,
                               reduce_from_tensor_parallel_region)

# Module name -> style, in the order they are applied (torchtitan's plan form).  Styles:
#   colwise_per_head: output features split per attention head across [q|k|v] (fused QKV)
#   colwise / rowwise: output / input features split contiguously
#   vocab: embedding rows split by vocabulary range; the tied output head uses the same shard.
TP_PLAN: dict[str, str] = {
    "transformer.wte": "vocab",
    "transformer.h.*.attn.c_attn": "colwise_per_head",
    "transformer.h.*.attn.c_proj": "rowwise",
    "transformer.h.*.mlp.c_fc": "colwise",
    "transformer.h.*.mlp.c_proj": "rowwise",
}


@dataclass(frozen=True)
class ShardSpec:
    """How a parameter is split across tensor-parallel ranks: along `dim`, in `stride` interleaved
    blocks (stride 3 for the fused [q|k|v] rows: each rank takes its slice of q, of k and of v)."""
    dim: int
    stride: int = 1

    def shard(self, full: torch.Tensor, rank: int, n: int) -> torch.Tensor:
        blocks = full.chunk(self.stride, dim=self.dim)
        return torch.cat([b.chunk(n, dim=self.dim)[rank] for b in blocks], dim=self.dim).contiguous()

    def unshard(self, shards: list[torch.Tensor]) -> torch.Tensor:
        per_rank = [s.chunk(self.stride, dim=self.dim) for s in shards]
        return torch.cat([per_rank[r][b] for b in range(self.stride) for r in range(len(shards))], dim=self.dim)


class _ShardedLinear(nn.Module):
    """A linear layer holding this rank's slice of the weight (and its bias, if any), with the group its
    collectives run in; the subclasses say where the slice is cut and which collective its forward needs."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group, meter: CommsMeter | None = None):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None
        self.group, self.meter = group, meter


class ColumnParallelLinear(_ShardedLinear):
    """y = x A^T + b with A's rows (output features) split across ranks; the input is replicated and the output
    stays split, for the row-parallel layer after it (attention's heads and the MLP's hidden features)."""

    def forward(self, x):
        return F.linear(copy_to_tensor_parallel_region(x, self.group, self.meter), self.weight, self.bias)


class RowParallelLinear(_ShardedLinear):
    """y = x A^T + b with A's columns (input features) split, its input the split output of a column-parallel
    layer; partial products are all-reduced and the replicated bias is added after the reduction (once, not once
    per rank)."""

    def forward(self, x):
        y = reduce_from_tensor_parallel_region(F.linear(x, self.weight), self.group, self.meter)
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """Embedding rows [start, end) of the (padded) vocabulary; ids outside the range give zeros and the
    ranks' partial lookups are summed."""

    def __init__(self, weight: torch.Tensor, vocab_start: int, group, meter: CommsMeter | None = None):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.vocab_start, self.vocab_end = vocab_start, vocab_start + weight.size(0)
        self.group, self.meter = group, meter

    def forward(self, ids):
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside[..., None], 0.0)
        return reduce_from_tensor_parallel_region(out, self.group, self.meter)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy from vocabulary-sharded logits: a max all-reduce, a target-logit
    all-reduce and a sum-of-exponentials all-reduce (Megatron's `vocab_parallel_cross_entropy`)."""

    @staticmethod
    def forward(ctx, logits, target, vocab_start, group, meter):
        logits = logits.float()
        logits_max = logits.max(dim=-1).values
        counted_all_reduce(logits_max, group, meter, op=dist.ReduceOp.MAX)
        shifted = logits - logits_max[:, None]
        outside = (target < vocab_start) | (target >= vocab_start + logits.size(-1))
        local_target = (target - vocab_start).masked_fill(outside, 0)
        rows = torch.arange(logits.size(0), device=logits.device)
        target_logit = shifted[rows, local_target].masked_fill(outside, 0.0)
        counted_all_reduce(target_logit, group, meter)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        counted_all_reduce(sum_exp, group, meter)
        loss = sum_exp.log() - target_logit
        ctx.save_for_backward(exp.div_(sum_exp[:, None]), outside, local_target)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, outside, local_target = ctx.saved_tensors
        grad = softmax.clone()
        rows = torch.arange(grad.size(0), device=grad.device)
        grad[rows, local_target] -= (~outside).to(grad.dtype)
        return grad * grad_loss[:, None], None, None, None, None


def vocab_parallel_cross_entropy(logits_shard, targets, vocab_start, group, meter=None, ignore_index=-1):
    """Mean cross-entropy over targets != ignore_index, from this rank's vocabulary columns."""
    logits_shard, targets = logits_shard.reshape(-1, logits_shard.size(-1)), targets.reshape(-1)
    losses = _VocabParallelCrossEntropy.apply(logits_shard, targets, vocab_start, group, meter)
    valid = targets != ignore_index
    return (losses * valid).sum() / valid.sum()


def _per_layer_heads_local(config, tp):
    return [config.layer_n_head(i) // tp for i in range(config.n_layer)]


class TensorParallelGPT(nn.Module):
    """The GPT with its layers replaced by their tensor-parallel shards.  Same call signature as GPT:
    training gets the vocabulary-parallel loss; inference gathers the logits (sliced to the real
    vocabulary), and a KV cache sized from `self.config` holds this rank's heads only."""

    def __init__(self, model: GPT, group, meter: CommsMeter | None, layout: dict[str, ShardSpec]):
        super().__init__()
        self.model = model
        self.group, self.meter = group, meter
        self.layout = layout  # full parameter name -> how it is sharded; others are replicated
        tp = dist.get_world_size(group)
        self.vocab_start = dist.get_rank(group) * model.config.padded_vocab_size // tp
        # The config this rank's modules see: same widths per head, a tp-th of the heads.
        self.config = dataclasses.replace(model.config, n_head_per_layer=_per_layer_heads_local(model.config, tp))

    def forward(self, idx, targets=None, cache: KVCache | None = None, last_only: bool = False):
        m, cfg = self.model, self.model.config
        # The trunk is the GPT's own; its sharded layers communicate inside.
        x = m.hidden_states(idx, cache, last_only)
        # Tied head: the embedding shard is also the head shard (logits for this rank's vocabulary range).
        local_logits = F.linear(copy_to_tensor_parallel_region(x, self.group, self.meter), m.lm_head.weight)
        columns = self.vocab_start + torch.arange(local_logits.size(-1), device=idx.device)
        local_logits = local_logits.masked_fill(columns >= cfg.vocab_size, float("-inf"))  # padding rows
        if targets is not None:
            loss = vocab_parallel_cross_entropy(local_logits, targets, self.vocab_start, self.group, self.meter)
            return None, loss
        logits = gather_from_tensor_parallel_region(local_logits, self.group, self.meter)
        return logits[..., :cfg.vocab_size], None


def apply_tensor_parallel(model: GPT, tp_group, meter: CommsMeter | None = None) -> TensorParallelGPT:
    """Shard `model` (full weights, identical on every rank, or meta tensors) in place following TP_PLAN."""
    rank, n = dist.get_rank(tp_group), dist.get_world_size(tp_group)
    layout: dict[str, ShardSpec] = {}
    for pattern, style in TP_PLAN.items():
        for name, module in list(model.named_modules()):
            if not fnmatch(name, pattern):
                continue
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            if style == "vocab":
                spec = ShardSpec(dim=0)
                weight = spec.shard(module.weight.detach(), rank, n)
                new = VocabParallelEmbedding(weight, rank * weight.size(0), tp_group, meter)
                layout[f"{name}.weight"] = spec
            else:
                w, b = module.weight.detach(), module.bias.detach() if module.bias is not None else None
                if style == "rowwise":
                    spec = ShardSpec(dim=1)
                    new = RowParallelLinear(spec.shard(w, rank, n), b, tp_group, meter)
                    layout[f"{name}.weight"] = spec
                else:
                    stride = 3 if style == "colwise_per_head" else 1
                    spec, bias_spec = ShardSpec(dim=0, stride=stride), ShardSpec(dim=0, stride=stride)
                    new = ColumnParallelLinear(spec.shard(w, rank, n),
                                               bias_spec.shard(b, rank, n) if b is not None else None, tp_group, meter)
                    layout[f"{name}.weight"] = spec
                    if b is not None:
                        layout[f"{name}.bias"] = bias_spec
            setattr(parent, child, new)
    for block in model.transformer.h:
        block.attn.n_head //= n  # this rank's heads; head_dim is unchanged
    model.lm_head.weight = model.transformer.wte.weight  # keep the tie: the head shard is the embedding shard
    return TensorParallelGPT(model, tp_group, meter, layout)
