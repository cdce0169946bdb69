"""Training batches of random windows and evaluation batches that sweep a whole split.

Training: each epoch lays non-overlapping windows of `block_size + 1` tokens over the split at a
random offset and visits them in a random order (both drawn from `seed` and the epoch number, so
every rank and every resumed run sees the same sequence).  A call draws one *global* micro-batch
and returns this data-parallel rank's contiguous slice of it, so the global batch does not depend
on how many ranks share it.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from data.corpus import DatasetError


class WindowSampler:
    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, seed: int = 0,
                 dp_rank: int = 0, dp_size: int = 1):
        if len(tokens) < 2 * (block_size + 1):
            raise DatasetError(f"the split has {len(tokens)} tokens, too few for windows of {block_size + 1}; "
                             f"use a smaller --block-size or a larger dataset")
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = batch_size  # per data-parallel rank
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.seed = seed
        self.epoch = 0
        self.cursor = 0  # windows of this epoch already handed out (globally)
        self._offset, self._order = self._epoch_order(0)

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.dp_size

    def _epoch_order(self, epoch: int) -> tuple[int, np.ndarray]:
        """The epoch's first window offset and its windows' indices in visiting order.  Indices, not start
        positions, in 4 bytes each: the order is the one array that grows with the corpus (one index per window,
        millions of them in a corpus of gigabytes).  Shuffling an index range draws the permutation `rng.permutation`
        would, so the order is the same whatever the index type."""
        rng = np.random.default_rng([self.seed, epoch])
        span = self.block_size + 1
        offset = int(rng.integers(0, span))
        windows = max(0, (len(self.tokens) - offset) // span)
        if windows < self.global_batch:
            raise DatasetError(f"an epoch holds {windows} windows, fewer than the global batch of "
                               f"{self.global_batch}; lower --batch-size or --block-size")
        order = np.arange(windows, dtype=np.int32 if windows < 2**31 else np.int64)
        rng.shuffle(order)
        return offset, order

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.cursor = epoch, 0
        self._offset, self._order = self._epoch_order(epoch)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cursor + self.global_batch > len(self._order):
            self.set_epoch(self.epoch + 1)
        span = self.block_size + 1
        starts = self._offset + self._order[self.cursor:self.cursor + self.global_batch].astype(np.int64) * span
        self.cursor += self.global_batch
        mine = starts[self.dp_rank * self.batch_size:(self.dp_rank + 1) * self.batch_size]
        windows = np.stack([self.tokens[s:s + span] for s in mine]).astype(np.int64)
        batch = torch.from_numpy(windows)
        return batch[:, :-1], batch[:, 1:]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.seed = state["seed"]
        self.set_epoch(state["epoch"])
        if not 0 <= state["cursor"] <= len(self._order):
            raise ValueError(f"cursor {state['cursor']} is outside the epoch's {len(self._order)} windows")
        self.cursor = state["cursor"]


def eval_batches(tokens: np.ndarray, block_size: int, batch_size: int,
                 max_batches: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive non-overlapping windows from the start of the split, in order.

    Every token after the first is a target exactly once; the last window is padded with target
    -1 (ignored).  With `max_batches`, the same leading windows are used every time.
    """
    n_targets = len(tokens) - 1
    n_windows = (n_targets + block_size - 1) // block_size
    if max_batches is not None:
        n_windows = min(n_windows, max_batches * batch_size)
    for first in range(0, n_windows, batch_size):
        rows = range(first, min(first + batch_size, n_windows))
        x = torch.zeros(len(rows), block_size, dtype=torch.int64)
        y = torch.full((len(rows), block_size), -1, dtype=torch.int64)
        for i, w in enumerate(rows):
            start = w * block_size
            length = min(block_size, n_targets - start)
            x[i, :length] = torch.from_numpy(tokens[start:start + length].astype(np.int64))
            y[i, :length] = torch.from_numpy(tokens[start + 1:start + 1 + length].astype(np.int64))
        yield x, y


def sliding_windows(tokens: np.ndarray, context: int, stride: int,
                    batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The sliding-window protocol of transformers' perplexity guide, with every target scored once.

    Window k scores the `stride` targets after position k*stride; its input reaches back up to
    `context` tokens, so every target but those in the first window sees at least
    `context - stride + 1` tokens before it.  Targets already scored by an earlier window are -1
    (ignored).  `stride == context` is the non-overlapping protocol.  Short final rows are padded
    on the right (the model is causal, so padding never changes a scored position).
    """
    if not 0 < stride <= context:
        raise DatasetError(f"the stride must be in 1..{context} (the context), got {stride}")
    n = len(tokens)
    rows = []
    for first_target in range(1, n, stride):
        end = min(first_target + stride, n)  # targets first_target .. end-1
        start = max(0, end - 1 - context)  # inputs start .. end-2
        rows.append((start, first_target, end))
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        width = max(end - 1 - start for start, _, end in chunk)
        x = torch.zeros(len(chunk), width, dtype=torch.int64)
        y = torch.full((len(chunk), width), -1, dtype=torch.int64)
        for r, (start, first_target, end) in enumerate(chunk):
            length = end - 1 - start
            x[r, :length] = torch.from_numpy(tokens[start:end - 1].astype(np.int64))
            targets = torch.from_numpy(tokens[start + 1:end].astype(np.int64))
            targets[:first_target - start - 1] = -1  # scored by the previous window
            y[r, :length] = targets
        yield x, y
