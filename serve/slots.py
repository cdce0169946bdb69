"""The running batch's rows: sequences that join and leave between decode steps.

Each row holds one sequence from column 0 at its own length, in each model's KV cache (the served model's, and a
draft's when decoding speculatively), beside the tokens it holds.  A step feeds each row its next tokens at its
own columns and positions, attending its own columns alone (model/kv_cache.py), so rows are never
aligned or shifted, and a row spans no more than its prompt and new tokens, within the model's context.  Active
sequences occupy rows 0..n-1: a leaving row is replaced by the last one, so a step runs on a plain slice of the
caches.
"""
from __future__ import annotations

import torch

from model.kv_cache import KVCache


def padded_rows(rows: int, max_rows: int) -> int:
    """`rows` active rows, and above 4 enough free ones to make a multiple of 4 (at most `max_rows`). A trace or
    capture is made for each row count it meets (a pause the server logs), so counts are rounded, as vLLM pads a
    batch to a size it captured a CUDA graph for."""
    return rows if rows <= 4 else min(-(-rows // 4) * 4, max_rows)


class Slots:
    """Rows of the running batch in each model's KV cache (the served model's first), with their tokens.  The
    caches hold each row's tokens but its last, which the next step feeds."""

    def __init__(self, caches: list[KVCache]):
        """Over empty `caches` (the served model's first), whose rows and columns bound the batch and a row."""
        self.caches = caches
        max_rows, width, device = caches[0].lengths.numel(), caches[0].max_len, caches[0].lengths.device
        # One column past the context: a row that ended in the step before is still extended once by a step launched
        # ahead (serve/runner.py), its unused token written there, before it leaves.
        self.tokens = torch.zeros(max_rows, width + 1, dtype=torch.long, device=device)
        self.lengths = torch.zeros(max_rows, dtype=torch.long, device=device)  # tokens each row holds
        self.row_numbers = torch.arange(max_rows, device=device)
        # Each row count's views of the caches, made once: they share the caches' storage, which is written in
        # place, so a view made before needs only its `length` and `aligned` read again, not a slice per layer's keys
        # and values.  Not even that while the batch keeps its rows: a step advances the caches through the views
        # it was handed, which keep count (`fresh`: the row count whose views are so up to date, if any).
        self.row_views: dict[int, list[KVCache]] = {}
        self.fresh: int | None = None
        self.rows = 0

    @property
    def max_rows(self) -> int:
        return self.tokens.size(0)

    def views(self, rows: int | None = None) -> tuple[list[KVCache], torch.Tensor, torch.Tensor]:
        """Rows 0..rows-1 of each cache, and their tokens and lengths: the active rows by default, then free rows
        that pad a traced step's batch (see `clear_free_rows`).  The caches' writes land here."""
        rows = self.rows if rows is None else rows
        views = self.row_views.get(rows)
        if views is None:
            views = self.row_views[rows] = [cache.first_rows(rows) for cache in self.caches]
        elif rows != self.fresh:
            for view in views:
                view.reread_lengths()
        self.fresh = rows
        return views, self.tokens[:rows], self.lengths[:rows]

    def clear_free_rows(self) -> None:
        """Free rows hold nothing: a step that padded its batch with them advanced their caches."""
        for cache in self.caches:
            cache.clear_rows(self.rows)
        self.fresh = None

    def add(self, prefills: list[KVCache], tokens: list[int], prefill_row: int = 0) -> None:
        """A sequence whose prompt each model prefilled in row `prefill_row` of a cache, holding `tokens` (the prompt
        and the first token sampled after it)."""
        if self.rows >= self.max_rows:
            raise RuntimeError(f"all {self.rows} rows are in use")
        row = self.rows
        for cache, prefill in zip(self.caches, prefills):
            cache.put_row(row, prefill, prefill_row)
        self.fresh = None
        self.tokens[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        self.lengths[row] = len(tokens)
        self.rows += 1

    def extend_each(self, tokens: torch.Tensor) -> None:
        """Rows 0..len(tokens)-1 each gained one token, row i `tokens[i]` (on the rows' device): one write for the
        batch, which reads nothing back."""
        rows = tokens.size(0)
        self.tokens[self.row_numbers[:rows], self.lengths[:rows]] = tokens
        self.lengths[:rows] += 1

    def extend(self, row: int, tokens: list[int]) -> None:
        """Row `row` gained `tokens`."""
        start = int(self.lengths[row])
        self.tokens[row, start: start + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        self.lengths[row] = start + len(tokens)

    def remove(self, row: int) -> None:
        """Free `row`; the last active row moves into its place."""
        last = self.rows - 1
        if row != last:
            for cache in self.caches:
                cache.put_row(row, cache, last)
            self.tokens[row] = self.tokens[last]
            self.lengths[row] = self.lengths[last]
        for cache in self.caches:
            cache.clear_rows(last)
        self.fresh = None
        self.lengths[last] = 0
        self.rows = last
