"""The output head and the cross-entropy in one autograd function, for training.

The plain path keeps three (tokens x vocabulary) tensors alive at once: the logits, log-softmax's output
(saved for backward) and, in backward, the gradients of both.  At GPT-2's vocabulary a batch of 8 x 256
tokens makes each of them 8 x 256 x 50,304 floats.  Here the forward pass computes the logits, then turns them in place,
a chunk of rows at a time, into the gradient of the loss with respect to them (softmax minus one-hot):
that one tensor is all backward needs, so the peak is one logits-sized tensor and backward skips the
softmax entirely.  The padded vocabulary columns are -inf: no probability, no gradient, the same loss as
over the real vocabulary.

Training fuses only on the CPU (`fuses_on`).  On a GPU the chunk loop is a few kernel launches per chunk, and it reads
row counts back to the host (a synchronisation each), which also breaks a `torch.compile` graph there;
the plain head and `F.cross_entropy` are a few large kernels that `torch.compile` fuses, as nanoGPT runs them.  The
GPU profile's train_speed (bench/experiments/train_speed.py) times train.py's step against nanoGPT's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

ROWS_PER_CHUNK = 256  # bounds the float32 temporaries of a chunk to a few tens of MB


def fuses_on(device: torch.device) -> bool:
    """Whether training on `device` takes the fused head and loss (see the module's docstring)."""
    return device.type == "cpu"


def _loss_sum_to_gradient(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Summed cross-entropy of (N, padded vocab) logits over the real vocabulary, a chunk of rows at a time; the
    logits are overwritten with d(sum)/d(logits) = softmax - one-hot."""
    valid = targets != -1
    loss_sum = torch.zeros((), dtype=torch.float32, device=logits.device)
    for start in range(0, logits.size(0), ROWS_PER_CHUNK):
        rows = slice(start, start + ROWS_PER_CHUNK)
        chunk = logits[rows].float()  # float32 logits: a view, edited in place
        chunk[:, vocab_size:] = float("-inf")
        lse = torch.logsumexp(chunk, dim=1)
        target, counted = targets[rows].clamp(min=0), valid[rows]
        loss_sum += ((lse - chunk.gather(1, target[:, None]).squeeze(1)) * counted).sum()
        chunk.sub_(lse[:, None]).exp_()
        chunk[torch.arange(len(target), device=chunk.device), target] -= 1
        if not counted.all():
            chunk.mul_(counted[:, None])
        if chunk.data_ptr() != logits.data_ptr() + start * logits.stride(0) * logits.element_size():
            logits[rows] = chunk  # a float32 copy of lower-precision logits goes back
    return loss_sum


def padded_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Mean cross-entropy without autograd (evaluation), a chunk of rows at a time: no logits-sized temporary.
    Each chunk goes through F.cross_entropy, whose fused log-softmax passes over it fewer times than logsumexp's
    subtract, exp and sum (bench/by_hand.md, "The evaluation loss through F.cross_entropy")."""
    logits, targets = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
    loss_sum = torch.zeros((), dtype=torch.float32, device=logits.device)
    for start in range(0, logits.size(0), ROWS_PER_CHUNK):
        chunk = logits[start:start + ROWS_PER_CHUNK].float()  # a view where the logits are float32
        chunk[:, vocab_size:] = float("-inf")
        loss_sum += F.cross_entropy(chunk, targets[start:start + ROWS_PER_CHUNK], ignore_index=-1, reduction="sum")
    return loss_sum / (targets != -1).sum()


class HeadCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int):
        """hidden (N, C), weight (padded vocab, C), targets (N,) with -1 ignored -> mean loss."""
        logits = hidden @ weight.t()  # under autocast this is the autocast dtype, as the plain head's is
        loss_sum = _loss_sum_to_gradient(logits, targets, vocab_size)
        ctx.save_for_backward(hidden, weight, logits)
        ctx.count = int((targets != -1).sum())
        return loss_sum / ctx.count  # NaN when nothing is counted, as F.cross_entropy gives

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        hidden, weight, grad_logits = ctx.saved_tensors
        grad_logits.mul_((grad_loss / ctx.count).to(grad_logits.dtype))  # saved once, used once
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_hidden = (grad_logits @ weight.to(grad_logits.dtype)).to(hidden.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = (grad_logits.t() @ hidden.to(grad_logits.dtype)).to(weight.dtype)
        return grad_hidden, grad_weight, None, None


def head_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                       vocab_size: int) -> torch.Tensor:
    """Mean cross-entropy of `hidden @ weight.T` over the real vocabulary, targets -1 ignored."""
    return HeadCrossEntropy.apply(hidden.reshape(-1, hidden.size(-1)), weight, targets.reshape(-1), vocab_size)
