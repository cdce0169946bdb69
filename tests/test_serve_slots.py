"""serve/slots.py: the views it keeps per row count stay what fresh views of the caches would say, as rows join,
steps advance them, padded steps clear their free rows, and rows leave; and a step's tokens land in one write."""
from __future__ import annotations

import torch

from model.config import preset
from model.kv_cache import KVCache
from serve.slots import Slots


def prefill(config, length: int) -> KVCache:
    cache = KVCache.allocate(config, 1, length, "cpu")
    cache.lengths[0] = length
    cache.reread_lengths()
    return cache


def assert_current(slots: Slots, rows: int) -> None:
    [view], _, _ = slots.views(rows)
    fresh = slots.caches[0].first_rows(rows)
    assert (view.length, view.aligned) == (fresh.length, fresh.aligned)
    assert torch.equal(view.lengths, fresh.lengths)


def test_kept_views_follow_joins_steps_padding_and_leaves():
    config = preset("tiny")
    slots = Slots([KVCache.allocate(config, 4, 32, "cpu")])
    slots.add([prefill(config, 5)], list(range(6)))
    assert_current(slots, 1)
    slots.views(1)[0][0].advance(1)  # a step through the views it was handed
    assert_current(slots, 1)
    slots.add([prefill(config, 3)], list(range(4)))
    assert_current(slots, 2)
    slots.views(3)[0][0].advance(1)  # a step padded with a free row
    slots.clear_free_rows()
    assert_current(slots, 2)
    assert_current(slots, 3)
    slots.remove(0)
    assert_current(slots, 1)
    assert slots.caches[0].lengths.tolist() == [4, 0, 0, 0]
    slots.remove(0)
    slots.add([prefill(config, 9)], list(range(10)))  # the same row count, another length
    assert_current(slots, 1)


def test_extend_each_writes_every_rows_token_after_its_own():
    config = preset("tiny")
    slots = Slots([KVCache.allocate(config, 4, 32, "cpu")])
    slots.add([prefill(config, 2)], [7, 8, 9])
    slots.add([prefill(config, 4)], [1, 2, 3, 4, 5])
    slots.extend_each(torch.tensor([10, 6]))
    assert slots.lengths.tolist() == [4, 6, 0, 0]
    assert slots.tokens[0, :4].tolist() == [7, 8, 9, 10]
    assert slots.tokens[1, :6].tolist() == [1, 2, 3, 4, 5, 6]
