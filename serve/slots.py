"""A KV cache whose rows are independent sequences that join and leave between decode steps.

GPT.forward continues every row of a cache at the same column (`cache.length`) and takes
per-row `positions` and a `key_mask`, so rows need not be aligned in position: a sequence
that joins with a prompt of P tokens is placed in the P columns just before the shared
length, and its other columns are masked out.  Columns run out as the shared length grows;
then every row is shifted left by the first column still in use (`compact`).  Each
sequence spans less than `block_size` columns, so a width of twice `block_size` means a
shift at most once per `block_size` steps.

Active sequences always occupy rows 0..n-1: a leaving row is replaced by the last one, so a
decode step runs on a plain slice of the cache.
"""
from __future__ import annotations

import torch

from model.config import GPTConfig
from model.gpt import KVCache, RaggedKVCache


def padded_rows(rows: int, max_rows: int) -> int:
    """`rows` active rows, and above 4 enough free ones to make a multiple of 4 (at most `max_rows`). A trace is
    made for each row count it meets (0.2-0.5 s for GPT-2 124M on 2 CPU cores, with its first runs), so counts
    are rounded, as vLLM pads a batch to a size it captured a CUDA graph for."""
    return rows if rows <= 4 else min(-(-rows // 4) * 4, max_rows)


class SlotCache:
    def __init__(self, config: GPTConfig, max_rows: int, device, dtype):
        self.width = 2 * config.block_size
        self.block_size = config.block_size
        self.cache = KVCache(config, max_rows, self.width, device, dtype)
        self.valid = torch.zeros(max_rows, self.width, dtype=torch.bool, device=device)
        self.start = [0] * max_rows  # first column of each row's sequence
        self.rows = 0
        self.length = 0  # the shared next column

    @property
    def max_rows(self) -> int:
        return self.valid.size(0)

    def view(self) -> KVCache:
        """The active rows as a KVCache for one GPT.forward call; writes land in this cache."""
        view = KVCache.__new__(KVCache)
        view.max_len = self.width
        view.k = [k[: self.rows] for k in self.cache.k]
        view.v = [v[: self.rows] for v in self.cache.v]
        view.length = self.length
        return view

    def key_mask(self) -> torch.Tensor | None:
        """(rows, length + 1): the keys each row may attend in the next one-token step, its own included; None
        when every row began at column 0 and so may attend every key (one client alone, or clients that
        arrived together), which spares the step the ~10 small kernels of building a mask."""
        self.valid[: self.rows, self.length] = True
        if not any(self.start[: self.rows]):
            return None
        return self.valid[: self.rows, : self.length + 1]

    def step_rows(self) -> int:
        """The rows a traced decode step runs on (`padded_rows`)."""
        return padded_rows(self.rows, self.max_rows)

    def step_views(self, rows: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Rows 0..rows-1 (the active ones, then free rows that pad a traced step's batch) of every layer's keys
        and values, up to and including the next column, which the step fills (model/decode_trace.py)."""
        end = self.length + 1
        return [k[:rows, :, :end] for k in self.cache.k], [v[:rows, :, :end] for v in self.cache.v]

    def step_mask(self, rows: int) -> torch.Tensor | None:
        """`key_mask()` for `rows` rows as (rows, 1, 1, length + 1), padding rows attending their next column
        alone; None as `key_mask()`."""
        if self.key_mask() is None:
            return None
        mask = self.valid[:rows, : self.length + 1].clone()
        mask[self.rows:, self.length] = True
        return mask[:, None, None, :]

    def advance(self) -> None:
        self.length += 1

    def ensure_room(self) -> None:
        """Make sure the next decode step has a column to write to."""
        if self.length >= self.width:
            self.compact()

    def add(self, prefill: KVCache, prompt_len: int) -> int:
        """Place a sequence prefilled in its own one-row cache; return its row."""
        if self.rows >= self.max_rows:
            raise RuntimeError(f"all {self.max_rows} rows are in use")
        if self.rows == 0:
            self.length = 0
        if prompt_len > self.length:
            self.compact()
        if prompt_len > self.length:
            self._shift(prompt_len - self.length)
        row, begin = self.rows, self.length - prompt_len
        for layer in range(len(self.cache.k)):
            self.cache.k[layer][row, :, begin:self.length] = prefill.k[layer][0, :, :prompt_len]
            self.cache.v[layer][row, :, begin:self.length] = prefill.v[layer][0, :, :prompt_len]
        self.valid[row] = False
        self.valid[row, begin:self.length] = True
        self.start[row] = begin
        self.rows += 1
        return row

    def remove(self, row: int) -> None:
        """Free `row`; the last active row moves into its place."""
        last = self.rows - 1
        if row != last:
            for layer in range(len(self.cache.k)):
                self.cache.k[layer][row, :, : self.length] = self.cache.k[layer][last, :, : self.length]
                self.cache.v[layer][row, :, : self.length] = self.cache.v[layer][last, :, : self.length]
            self.valid[row] = self.valid[last]
            self.start[row] = self.start[last]
        self.valid[last] = False
        self.rows = last
        if self.rows == 0:
            self.length = 0

    def compact(self) -> None:
        """Shift every row left by the first column any row still uses."""
        if self.rows == 0:
            self.length = 0
            return
        shift = min(self.start[: self.rows])
        if shift == 0:
            return
        self._shift(-shift)

    def _shift(self, by: int) -> None:
        """Move all active rows `by` columns (right when positive, left when negative)."""
        n, old = self.rows, self.length
        new = old + by
        src, dst = (slice(0, old), slice(by, new)) if by > 0 else (slice(-by, old), slice(0, new))
        for layer in range(len(self.cache.k)):
            for t in (self.cache.k[layer], self.cache.v[layer]):
                t[:n, :, dst] = t[:n, :, src].clone()
        moved = self.valid[:n, src].clone()
        self.valid[:n] = False
        self.valid[:n, dst] = moved
        for row in range(n):
            self.start[row] += by
        self.length = new


class SpeculativeSlots:
    """The running batch's rows when a draft model proposes tokens (model/speculative.py): the target's and the
    draft's KV caches, each row from column 0 at its own length (RaggedKVCache), and the tokens each row holds.
    Rows keep different numbers of tokens at every step, so they are not aligned to a shared column as in
    SlotCache.  Active sequences occupy rows 0..n-1; a leaving row is replaced by the last one."""

    def __init__(self, target_config: GPTConfig, draft_config: GPTConfig, max_rows: int, device,
                 target_dtype, draft_dtype):
        width = target_config.block_size  # a request's prompt and new tokens fit the target's context
        self.target = RaggedKVCache(target_config, max_rows, width, device, target_dtype)
        self.draft = RaggedKVCache(draft_config, max_rows, width, device, draft_dtype)
        self.tokens = torch.zeros(max_rows, width, dtype=torch.long, device=device)
        self.lengths = torch.zeros(max_rows, dtype=torch.long, device=device)  # tokens each row holds
        self.rows = 0

    def views(self) -> tuple[RaggedKVCache, RaggedKVCache, torch.Tensor, torch.Tensor]:
        """The active rows' target cache, draft cache, tokens and lengths; the caches' writes land here."""
        return (self.target.first_rows(self.rows), self.draft.first_rows(self.rows), self.tokens[: self.rows],
                self.lengths[: self.rows])

    def add(self, target_prefill: KVCache, draft_prefill: KVCache, tokens: list[int]) -> None:
        """A sequence whose prompt both models prefilled in one-row caches, holding `tokens` (the prompt and the
        first token sampled after it)."""
        if self.rows >= self.target.k[0].size(0):
            raise RuntimeError(f"all {self.rows} rows are in use")
        row = self.rows
        for cache, prefill in ((self.target, target_prefill), (self.draft, draft_prefill)):
            for layer in range(len(cache.k)):
                cache.k[layer][row, :, : prefill.length] = prefill.k[layer][0, :, : prefill.length]
                cache.v[layer][row, :, : prefill.length] = prefill.v[layer][0, :, : prefill.length]
            cache.lengths[row] = prefill.length
        self.tokens[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        self.lengths[row] = len(tokens)
        self.rows += 1

    def extend(self, row: int, tokens: list[int]) -> None:
        """Row `row` gained `tokens`."""
        start = int(self.lengths[row])
        self.tokens[row, start: start + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        self.lengths[row] = start + len(tokens)

    def remove(self, row: int) -> None:
        """Free `row`; the last active row moves into its place."""
        last = self.rows - 1
        if row != last:
            for cache in (self.target, self.draft):
                end = int(cache.lengths[last])
                for layer in range(len(cache.k)):
                    cache.k[layer][row, :, :end] = cache.k[layer][last, :, :end]
                    cache.v[layer][row, :, :end] = cache.v[layer][last, :, :end]
                cache.lengths[row] = cache.lengths[last]
            self.tokens[row] = self.tokens[last]
            self.lengths[row] = self.lengths[last]
        for cache in (self.target, self.draft):
            cache.lengths[last] = 0
        self.lengths[last] = 0
        self.rows = last
