"""Sampling the running batch's rows, and a plain step's sampled tokens on their way to the host, so that the
engine's thread can launch the next step before it reads them (serve/runner.py, `async_steps`).

On a GPU each tensor is copied into pinned host memory without waiting, and an event marks when the copies are
done: the thread waits for that event, which comes before the next step's kernels in the queue, rather than for
the queue to drain, as a plain read (`.tolist()`) of a GPU tensor would.  On the CPU the tensors are the host's
already and nothing waits.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from decode.row_state import TokenLogprob, logprob_entries, logprob_tensors
from decode.sampling import sample_rows_on_device
from serve.sequence import Sequence

log = logging.getLogger("serve.engine")


class Readback:
    """`tensors` copied to the host as the device gets to them; `read` waits for the copies alone."""

    def __init__(self, tensors: list[torch.Tensor]):
        # On a GPU, .to("cpu", non_blocking=True) lands in pinned memory and is queued behind the kernels before it.
        self.host = [tensor.to("cpu", non_blocking=True) for tensor in tensors]
        self.ready = None
        if any(tensor.device.type == "cuda" for tensor in tensors):
            self.ready = torch.cuda.Event()
            self.ready.record()

    def read(self) -> list[torch.Tensor]:
        if self.ready is not None:
            self.ready.synchronize()
        return self.host


@dataclass
class SampledStep:
    """The tokens one step sampled for its rows, row i's for `seqs[i]` (the sequences as the step ran: rows leave
    and move before a step launched ahead is read), and the log-probabilities of the rows that keep them."""
    seqs: list[Sequence]
    tokens: torch.Tensor  # (rows,) on the device, which the next step reads as its input
    failed: set[int]  # rows whose sampling failed (their token is a placeholder)
    logprob_rows: list[int]
    readback: Readback  # the tokens, then each logprob row's logprob_tensors

    def read(self) -> tuple[list[int], dict[int, TokenLogprob]]:
        """Each row's token, and the entry of each row that keeps log-probabilities."""
        tokens, *scores = self.readback.read()
        tokens = tokens.tolist()
        entries = {row: logprob_entries([tokens[row]], *scores[3 * i: 3 * i + 3])[0]
                   for i, row in enumerate(self.logprob_rows)}
        return tokens, entries


def sample_step(logits: torch.Tensor, active: list[Sequence]) -> SampledStep:
    """Every active row's token from a step's `logits` (rows, 1, vocab), on the device, with the log-probabilities
    of the rows that keep them worked out there too (a captured step's next run overwrites its logits); none for a
    row that ended before (its token is never read)."""
    seqs = list(active)
    tokens, failed = sample_sequences(logits[:, -1], seqs)
    logprob_rows = [row for row, seq in enumerate(seqs)
                    if seq.row.logprobs is not None and not seq.done and row not in failed]
    scores = [tensor for row in logprob_rows
              for tensor in logprob_tensors(logits[row, -1][None], tokens[row:row + 1], seqs[row].row.top_logprobs)]
    return SampledStep(seqs, tokens, failed, logprob_rows, Readback([tokens, *scores]))


def sample_sequences(logits: torch.Tensor, seqs: list[Sequence]) -> tuple[torch.Tensor, set[int]]:
    """One token per sequence from `logits` (rows, vocab), sampled together, on the device; and the rows whose
    sampling failed (logged), whose token is 0.

    When the batch fails, each row is sampled again alone from its generator's state before the
    batch: a row's token depends only on its own logits, settings and generator, so the rows that
    succeed get the token they would have got in the batch.
    """
    generators = [seq.generator for seq in seqs]
    # A greedy row draws nothing: only the rows that draw need their generator's state kept.
    states = [None if seq.params.greedy else seq.generator.get_state() for seq in seqs]
    try:
        return sample_rows_on_device(logits, [seq.params for seq in seqs], generators,
                                     [seq.row.tokens for seq in seqs]), set()
    except Exception:  # find the rows that fail, so that only they end
        log.exception("sampling a batch of %d failed; sampling its rows one at a time", len(seqs))
    tokens, failed = [], set()
    for row, (seq, state) in enumerate(zip(seqs, states)):
        if state is not None:
            seq.generator.set_state(state)
        try:
            tokens.append(sample_rows_on_device(logits[row:row + 1], [seq.params], [seq.generator], [seq.row.tokens]))
        except Exception:  # this request alone ends
            log.exception("sampling failed for a request with %s", seq.params)
            tokens.append(torch.zeros(1, dtype=torch.long, device=logits.device))
            failed.add(row)
    return torch.cat(tokens), failed
