"""Sample one token for every row of a batch, each row with its own settings and its own generator.

Rows that share settings are filtered together (`filter_logits`, one call per group instead of
one per row); with top-k, only the k best tokens enter the distribution
(where k-th place is tied, `filter_logits` would keep every tied token; here exactly k).
Each row then draws a single uniform number from its own generator and picks its token by
inverting its cumulative distribution.  A row's token thus
depends only on its logits, its settings and its generator's state, never on the other rows.

Why not `torch.multinomial` per row: it draws a random number per vocabulary entry and the
per-row calls dominated a decode step of the demo model (50257 entries x 12 rows); so did
full-vocabulary softmax and cumulative sums when top-k leaves 200 candidates.  `sample.py`
(through `decode/generate.py`) and the server share this sampler, so a seed gives the same text in both.

`logit_bias` and the presence and frequency penalties (OpenAI's semantics, `adjust_logits`) change a row's
logits before its settings filter them; they are per row, so they do not split the groups.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from runtime.errors import UserError

# OpenAI's bounds for its completions API's logit_bias values and penalties.
MAX_LOGIT_BIAS = 100.0
MAX_PENALTY = 2.0
# Below this temperature decoding is greedy, which is what the temperature means in the limit: already at
# 1e-4, float32 gives no probability to a token more than 0.011 below the best logit (exp(-110) underflows).
GREEDY_BELOW_TEMPERATURE = 1e-4


class SamplingError(UserError, ValueError):
    """A sampling setting whose result is undefined; the message names it, and `field` is its name."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0 (or anything below GREEDY_BELOW_TEMPERATURE) means greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_at_eot: bool = True
    # (token id, value added to its logit) pairs, ids ascending; a tuple, so that settings compare and hash.
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0  # subtracted from the logit of every token the row generated before
    frequency_penalty: float = 0.0  # subtracted once per time the row generated the token before

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SamplingError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_p is not None and not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise SamplingError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise SamplingError(f"top_k must be at least 1, got {self.top_k}")
        if self.max_new_tokens < 0:
            raise SamplingError(f"max_new_tokens must be 0 or more, got {self.max_new_tokens}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -MAX_PENALTY <= value <= MAX_PENALTY):
                raise SamplingError(f"{name} must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value}", name)
        for token, bias in self.logit_bias:
            if token < 0:
                raise SamplingError(f"logit_bias: token id {token} is negative; ids start at 0", "logit_bias")
            if not (math.isfinite(bias) and -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS):
                raise SamplingError(f"logit_bias: the bias of token {token} must be in [-{MAX_LOGIT_BIAS:g}, "
                                    f"{MAX_LOGIT_BIAS:g}], got {bias}", "logit_bias")

    @property
    def adjusts_logits(self) -> bool:
        """Whether the row's logits change before sampling (a bias or a penalty)."""
        return bool(self.logit_bias) or self.presence_penalty != 0 or self.frequency_penalty != 0

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Scale by temperature and mask what top-k / nucleus sampling excludes (rows are sequences).

    Logits are scaled relative to their row's best, so that none overflows to +inf however small the
    temperature or large the logits; a softmax is unchanged by the shift.
    """
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        # Drop a token once the mass before it already reaches top_p.
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop_sorted[..., 0] = False  # the best token always stays, even when top_p rounds to 0 in float32
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def row_generators(seed: int | None, rows: int, device) -> list[torch.Generator]:
    """Row i samples from seed + i (as the server's `n` completions do); without a seed, from torch's global RNG."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()))
    return [torch.Generator(device=device).manual_seed(seed + i) for i in range(rows)]


def settings_key(params: SamplingParams) -> tuple:
    return (0.0, None, None) if params.greedy else (params.temperature, params.top_k, params.top_p)


def settings_groups(params: list[SamplingParams]) -> dict[tuple, list[int]]:
    """The rows of each distinct setting (settings_key), so that rows sharing one are computed together."""
    groups: dict[tuple, list[int]] = {}
    for row, p in enumerate(params):
        groups.setdefault(settings_key(p), []).append(row)
    return groups


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator],
                generated: list[Sequence[int]] | None = None) -> list[int]:
    """logits (rows, vocab); one token id per row.  `generated[i]`: the tokens row i generated so far, which its
    penalties count (needed when a row has penalties)."""
    tokens = [0] * logits.size(0)
    for rows, chosen in _group_tokens(logits, params, generators, generated, on_device=False):
        for row, token in zip(rows, chosen):
            tokens[row] = token
    return tokens


def sample_rows_on_device(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator],
                          generated: list[Sequence[int]] | None = None) -> torch.Tensor:
    """`sample_rows`' tokens, the same ones, as a tensor (rows,) on the logits' device, which the host does not
    wait for: the server's steps launched ahead (serve/runner.py) feed it to the next step on the device and read it
    back while that step computes.  Nothing here reads a GPU's values back or copies to it from pageable memory
    (either waits for every kernel queued before it)."""
    groups = list(_group_tokens(logits, params, generators, generated, on_device=True))
    if len(groups) == 1:  # one setting for the batch: its rows are all the rows, in order
        return groups[0][1]
    tokens = torch.zeros(logits.size(0), dtype=torch.long, device=logits.device)
    for rows, chosen in groups:
        tokens[host_values_on(logits.device, rows, torch.long)] = chosen
    return tokens


def host_values_on(device: torch.device, values: list, dtype: torch.dtype) -> torch.Tensor:
    """`values` (a short host list) as a tensor on `device` (`host_tensor_on`)."""
    return host_tensor_on(device, torch.tensor(values, dtype=dtype))


def host_tensor_on(device: torch.device, tensor: torch.Tensor) -> torch.Tensor:
    """A small host `tensor` on `device`.  A plain copy to a GPU waits for every kernel queued before it (from
    pageable memory it must); from pinned memory it is queued behind them instead."""
    return tensor.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else tensor.to(device)


def _group_tokens(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator],
                  generated: list[Sequence[int]] | None, on_device: bool):
    """(rows, their tokens) for each group of rows that share a setting: the tokens a list, or with `on_device` a
    tensor on the logits' device."""
    for (temperature, top_k, top_p), rows in settings_groups(params).items():
        whole = len(rows) == logits.size(0)  # rows are ascending: the whole batch, in order
        chosen = logits if whole else logits.index_select(0, host_values_on(logits.device, rows, torch.long))
        if temperature == 0 and not any(params[row].adjusts_logits for row in rows):
            if on_device and logits.device.type != "cpu":
                # plain_argmax's answer without reading the logits back: its token where the row's best is finite,
                # else the cleaning path's below (which, for such a row, it would have fallen back to).
                values, best = chosen.max(-1)
                yield rows, torch.where(torch.isfinite(values), best, _cleaned(chosen).argmax(-1))
                continue
            best = plain_argmax(chosen)
            if best is not None:
                yield rows, torch.tensor(best, device=logits.device) if on_device else best
                continue
        # NaN logits (a broken model) get no probability; +inf ones become the largest float, so that they
        # share the row's mass rather than make it NaN; a row with nothing above -inf decodes token 0.
        group = _cleaned(chosen)
        # On the group's own copy, and only on the rows that ask for it.
        adjust_logits(group, [params[row] for row in rows], None if generated is None else [generated[r] for r in rows])
        if temperature == 0:
            best_tensor = group.argmax(-1)
            yield rows, best_tensor if on_device else best_tensor.tolist()
            continue
        if top_k is not None and top_k < group.size(-1):
            # Only the k best tokens can be drawn: the distribution over them is all that is needed.
            candidates = torch.topk(group, top_k, dim=-1)
            logits_k, ids = candidates.values, candidates.indices
            cdf = filter_logits(logits_k, temperature, None, top_p).softmax(-1).double().cumsum(-1)
        else:
            ids = None
            # float64 sums keep the cumulative distribution exact enough over 50k entries.
            cdf = filter_logits(group, temperature, None, top_p).softmax(-1).double().cumsum(-1)
        choices = draw(cdf, [generators[row] for row in rows])
        if ids is not None:
            choices = ids.gather(1, choices[:, None])[:, 0]
        yield rows, choices if on_device else choices.tolist()


def _cleaned(logits: torch.Tensor) -> torch.Tensor:
    """A float32 copy of `logits` with NaN at -inf and +inf at the largest float."""
    return torch.nan_to_num(logits.float(), nan=float("-inf"), posinf=torch.finfo(torch.float32).max,
                            neginf=float("-inf"))


# Logits whose greedy tokens plain_argmax reads through numpy on the CPU; the rest keep torch's reduction (numpy has no
# bfloat16, and half-precision logits come from GPU runs).
NUMPY_ARGMAX_DTYPES = (torch.float32, torch.float64)


def plain_argmax(logits: torch.Tensor) -> list[int] | None:
    """Each row's best token (the first of equals) when every row's best logit is finite, read from the logits as
    they are: the greedy tokens of a batch without NaN or infinite logits, with no copy of the logits made to clean
    them (a copy of every row's vocabulary, at each step); None when a row's best is not finite (a NaN, which the
    maximum propagates, or an infinity), for `sample_rows`' cleaning path to decide."""
    if logits.device.type == "cpu" and logits.dtype in NUMPY_ARGMAX_DTYPES:
        # numpy's argmax runs on the CPU's vector units; torch's reductions that keep an index (max over a
        # dimension, argmax, topk) do not, and took several times as long over a vocabulary's logits
        # (bench/by_hand.md, "greedy tokens by numpy's argmax").  Same answer: the first best of each row, and a NaN
        # anywhere in a row is its best, as the maximum propagates it.
        scores = logits.detach().numpy()  # the tensor's own memory, no copy
        best = scores.argmax(-1)
        return best.tolist() if np.isfinite(scores[np.arange(best.size), best]).all() else None
    return torch_argmax(logits)


def torch_argmax(logits: torch.Tensor) -> list[int] | None:
    """`plain_argmax` by torch's own reduction (`max` over the vocabulary, values and indices), on any device and
    dtype: the path it keeps for the logits numpy does not read."""
    values, best = logits.max(-1)
    best = torch.where(torch.isfinite(values), best, -1).tolist()  # one read-back
    return None if -1 in best else best


def adjust_logits(logits: torch.Tensor, params: list[SamplingParams],
                  generated: list[Sequence[int]] | None) -> None:
    """In place on `logits` (rows, vocab), OpenAI's logit_bias and penalties for the rows whose params[i] ask for
    them: logits[j] += bias[j], then logits[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty, c[j]
    counting token j among generated[i].

    What it costs: a row without them, one check per step (they batch with it in the same forward pass and
    sampling group); a row with them, per step, an indexed add of its bias (at most a few hundred ids) and one
    count of its generated tokens (torch.unique over them), on the copy of its logits the sampler makes anyway."""
    for row, p in enumerate(params):
        if not p.adjusts_logits:
            continue
        if p.logit_bias:
            last = p.logit_bias[-1][0]  # ids ascending: the largest
            if last >= logits.size(-1):
                raise SamplingError(f"logit_bias: token id {last} is outside this model's {logits.size(-1)} "
                                    f"logits; ids run from 0 to {logits.size(-1) - 1}", "logit_bias")
            ids = host_values_on(logits.device, [token for token, _ in p.logit_bias], torch.long)
            logits[row, ids] += host_values_on(logits.device, [bias for _, bias in p.logit_bias], torch.float32)
        if (p.presence_penalty or p.frequency_penalty) and generated is None:
            raise ValueError("penalties count the tokens each row generated: pass `generated` to sample_rows")
        if (p.presence_penalty or p.frequency_penalty) and generated[row]:
            # Counted on the host, where the tokens are: on a GPU, unique's result size is read back.
            ids, counts = torch.tensor(list(generated[row])).unique(return_counts=True)
            ids, counts = host_tensor_on(logits.device, ids), host_tensor_on(logits.device, counts)
            logits[row, ids] -= counts * p.frequency_penalty + p.presence_penalty


def draw(cdf: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """Row i's entry whose interval of its cumulative distribution `cdf[i]` holds a uniform draw from
    generators[i].  One tensor for the group, read back with one transfer: on a GPU, a value read per row
    is a synchronisation per row, and twelve rows spent more time waiting than computing."""
    u = torch.stack([torch.rand((), dtype=torch.float64, generator=g, device=cdf.device) for g in generators])
    total = cdf[:, -1].contiguous()
    index = torch.searchsorted(cdf, (u * total)[:, None], right=True)[:, 0]
    # u * total rounded up to total: take the last token with any mass.
    index = torch.where(index >= cdf.size(-1), torch.searchsorted(cdf, total[:, None])[:, 0], index)
    index = index.clamp(max=cdf.size(-1) - 1)
    # No usable distribution (NaN, or nothing above -inf): the first entry (top-k: the best).
    usable = torch.isfinite(total) & (total > 0)
    return torch.where(usable, index, torch.zeros_like(index))
