"""Speculative decoding (Leviathan et al. 2023, Chen et al. 2023): a smaller draft model proposes K tokens one at
a time, the target scores all K + 1 positions in one forward pass, and each row keeps the proposals the target
agrees with, then one token of the target's own (the correction at the first disagreement, or a bonus token when
all K are kept).  A step costs the target one pass however many tokens it keeps.

Greedy: a proposal is kept when it is the target's argmax, and the token after the kept ones is the target's
argmax, so the tokens are those the target alone decodes.  Sampling: a proposal x drawn from the draft's
distribution q is kept with probability min(1, p(x) / q(x)) (p: the target's); at the first rejection the row
draws from normalize(max(0, p - q)), after K acceptances from p.  Every kept token is then distributed as the
target's own sampler draws it.  p and q are the distributions decode/sampling.py draws from (the same temperature,
top-k and top-p), and every row draws from its own seeded generator, so a seed gives the same tokens again.

Rows keep different numbers of tokens at each step, which the KV cache allows (model/kv_cache.py): each row at
its own length, positions and an attention mask per row, rejected tokens truncated.  A row that is done
(end-of-text, or max_new_tokens) leaves the batch.  Each model's passes run through its DecodeSteps
(decode/steps.py); on the CPU under decode `auto` the passes after the prompt are traced graphs: an eager
pass over a few tokens spends as long in Python between operators as in them, which would eat most of what a
step saves.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from model.config import EOT_TOKEN
from decode.steps import DecodeSteps
from model.gpt import GPT
from model.kv_cache import KVCache
from decode.row_state import RowState
from decode.sampling import SamplingParams, draw, filter_logits, row_generators, settings_groups
from runtime.errors import UserError

# Draft tokens per step.  The best count grows with the draft's acceptance rate and falls with its cost relative to
# the target's (Leviathan et al. 2023) and with the rows checked together; of the counts `python -m bench.experiments
# speculative` times, 4 is the one that paid in every case it measures (greedy at batch 1 and 4, sampled).
DEFAULT_DRAFT_TOKENS = 4


class DraftMismatch(UserError, ValueError):
    """A draft model that cannot serve the target; the message names the difference and the fix."""


@dataclass
class SpeculativeStats:
    """What a speculative generation did, summed over rows: pass an instance to generate() to have it filled."""
    proposed: int = 0  # draft tokens proposed
    accepted: int = 0  # of those, the ones the target's check kept
    target_passes: int = 0  # target forward passes (each scores K + 1 positions of every row still generating)
    row_steps: int = 0  # rows in those passes, summed: each gained its accepted tokens plus one of the target's

    def add(self, other: SpeculativeStats) -> None:
        self.proposed += other.proposed
        self.accepted += other.accepted
        self.target_passes += other.target_passes
        self.row_steps += other.row_steps

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        """Mean tokens a row gained per target pass (1 is plain decoding; K + 1 the most)."""
        return (self.accepted + self.row_steps) / self.row_steps if self.row_steps else 0.0

    def summary(self) -> str:
        return (f"speculative decoding: {self.accepted} of {self.proposed} draft tokens accepted "
                f"({self.acceptance_rate:.1%}), {self.tokens_per_target_pass:.2f} tokens per row per target pass, "
                f"{self.target_passes} target passes")


def check_draft(model: GPT, draft: GPT, tokens_needed: int, draft_tokens: int) -> None:
    if draft.config.vocab_size != model.config.vocab_size:
        raise DraftMismatch(f"the draft model's vocabulary has {draft.config.vocab_size} tokens and the target's "
                            f"{model.config.vocab_size}; a draft must share the target's vocabulary: use one "
                            f"trained with the same tokenizer (e.g. a pruned or smaller copy of the target)")
    if draft.config.block_size < tokens_needed:
        raise DraftMismatch(f"the draft model's context of {draft.config.block_size} tokens is shorter than the "
                            f"{tokens_needed} that the prompt + max_new_tokens need; ask for fewer new tokens or "
                            f"use a draft with a longer context (block_size)")
    if draft_tokens < 1:
        raise DraftMismatch(f"draft_tokens must be at least 1, got {draft_tokens}")


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(rows, vocab): the distribution decode/sampling.py's sample_rows draws from for non-greedy `params`,
    with the same cleaning of NaN and infinite logits and exactly the k best tokens under top-k."""
    logits = torch.nan_to_num(logits.float(), nan=float("-inf"), posinf=torch.finfo(torch.float32).max,
                              neginf=float("-inf"))
    if params.top_k is not None and params.top_k < logits.size(-1):
        best = torch.topk(logits, params.top_k, dim=-1)
        probs = filter_logits(best.values, params.temperature, None, params.top_p).softmax(-1)
        return torch.zeros_like(logits).scatter(-1, best.indices, probs)
    return filter_logits(logits, params.temperature, None, params.top_p).softmax(-1)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The argmax that sample_rows takes for greedy decoding (NaN never wins)."""
    return torch.nan_to_num(logits.float(), nan=float("-inf")).argmax(-1)


def catch_up_inputs(cache: KVCache, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The tokens (rows, W) that bring row i of `cache` to `lengths[i]` tokens of `tokens`.  One forward pass
    feeds every row the same number W, so a row that lacks fewer is first truncated to re-feed some it holds."""
    width = int((lengths - cache.lengths).max())
    start = lengths - width
    cache.truncate(start)
    return tokens.gather(1, start[:, None] + torch.arange(width, device=tokens.device))


def row_distributions(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """(rows, positions, vocab) from logits of that shape: the distribution row i's sampler draws from under
    params[i], all of it on the argmax for a greedy row.  Rows that share settings are computed together."""
    rows, positions, vocab = logits.shape
    probs = torch.empty(rows, positions, vocab, dtype=torch.float32, device=logits.device)
    for rows_in_group in settings_groups(params).values():
        index = torch.tensor(rows_in_group, device=logits.device)
        group, p = logits.index_select(0, index), params[rows_in_group[0]]
        if p.greedy:
            dist = torch.zeros_like(group, dtype=torch.float32).scatter_(-1, greedy_tokens(group)[..., None], 1.0)
        else:
            dist = sampling_probs(group.reshape(-1, vocab), p).view(len(rows_in_group), positions, vocab)
        probs.index_copy_(0, index, dist)
    return probs


def propose(draft_steps: DecodeSteps, cache: KVCache, tokens: torch.Tensor, lengths: torch.Tensor, k: int,
            params: list[SamplingParams], generators: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """k draft tokens per row (rows, k), drawn one at a time with row i's params[i] by the draft's steps, and the
    distributions they were drawn from (rows, k, vocab; None when every row is greedy)."""
    all_greedy = all(p.greedy for p in params)
    step_input = catch_up_inputs(cache, tokens, lengths)
    proposals, dists = [], []
    for _ in range(k):
        logits = draft_steps.logits(cache, step_input, 1)
        if all_greedy:
            token = greedy_tokens(logits[:, -1])
        else:
            q = row_distributions(logits[:, -1:], params)[:, 0]
            token = draw(q.double().cumsum(-1), generators)
            dists.append(q)
        proposals.append(token)
        step_input = token[:, None]
    return torch.stack(proposals, 1), torch.stack(dists, 1) if dists else None


def score(target_steps: DecodeSteps, cache: KVCache, tokens: torch.Tensor, lengths: torch.Tensor,
          proposals: torch.Tensor) -> torch.Tensor:
    """The target's logits (rows, k + 1, vocab) after each row's last token and after each of its proposals, from
    one pass of the target's steps."""
    inputs = torch.cat([catch_up_inputs(cache, tokens, lengths), proposals], 1)
    return target_steps.logits(cache, inputs, proposals.size(1) + 1)


def judge(proposals: torch.Tensor, q: torch.Tensor | None, logits: torch.Tensor, params: list[SamplingParams],
          generators: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """How many proposals each row keeps (rows,), and the target's token that follows them (rows,).  A greedy
    row's distributions put all their mass on one token, so the rule below keeps exactly the proposals that are
    the target's argmax there; when every row is greedy that is checked directly."""
    rows, k = proposals.shape
    if q is None:
        best = greedy_tokens(logits)
        kept = (proposals == best[:, :k]).long().cumprod(1).sum(1)
        return kept, best.gather(1, kept[:, None])[:, 0]
    p = row_distributions(logits, params)
    p_x = p[:, :k].gather(-1, proposals[..., None])[..., 0].double()
    q_x = q.gather(-1, proposals[..., None])[..., 0].double()
    u = torch.stack([torch.rand(k, dtype=torch.float64, generator=g, device=p.device) for g in generators])
    kept = (u * q_x < p_x).long().cumprod(1).sum(1)  # u < p(x) / q(x), without dividing by a q(x) of 0
    # The next token: from max(0, p - q) at the first rejection, from p (q padded with zeros) after k acceptances.
    rows_index = torch.arange(rows, device=p.device)
    p_next = p[rows_index, kept]
    q_next = torch.cat([q, torch.zeros_like(q[:, :1])], 1)[rows_index, kept]
    residual = (p_next - q_next).clamp(min=0)
    # Rounding can leave no mass where p and q agree to the last bit; then the rejection had probability ~0.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)
    return kept, draw(residual.double().cumsum(-1), generators)


def speculative_step(target_steps: DecodeSteps, draft_steps: DecodeSteps, target_cache: KVCache,
                     draft_cache: KVCache, tokens: torch.Tensor, lengths: torch.Tensor, k: int,
                     params: list[SamplingParams], generators: list[torch.Generator]) -> tuple[torch.Tensor, ...]:
    """One step for rows holding `lengths[i]` tokens of `tokens` (rows, columns), row i sampling with params[i]
    and generators[i]: the draft proposes k tokens, the target scores them in one pass, and each row keeps a
    prefix.  Returns the proposals (rows, k), the count each row keeps (rows,), the target's token after the
    kept ones (rows,) and the target's logits (rows, k + 1, vocab), position j the distribution of the row's
    token j of this step.  Both caches are left holding each row's tokens up to its last kept proposal; the
    target's own token is fed at the next step."""
    proposals, q = propose(draft_steps, draft_cache, tokens, lengths, k, params, generators)
    logits = score(target_steps, target_cache, tokens, lengths, proposals)
    kept, next_token = judge(proposals, q, logits, params, generators)
    target_cache.truncate(lengths + kept)
    draft_cache.truncate(lengths + kept)
    return proposals, kept, next_token, logits


@torch.inference_mode()
def speculative_generate(target_steps: DecodeSteps, draft_steps: DecodeSteps, idx: torch.Tensor,
                         params: SamplingParams, draft_tokens: int = DEFAULT_DRAFT_TOKENS, on_token=None,
                         stats: SpeculativeStats | None = None, rows: list[RowState] | None = None) -> torch.Tensor:
    """generate()'s result for the target model (see decode/generate.py), decoded with the draft proposing
    `draft_tokens` tokens per step, each model's passes run by its steps; `stats`, when given, is filled in, and
    `rows` (one RowState per row, plain ones by default) take each row's tokens.  The target's context is checked
    by generate()."""
    model, draft = target_steps.model, draft_steps.model
    model.eval()
    draft.eval()
    B, T = idx.shape
    end = T + params.max_new_tokens
    check_draft(model, draft, end, draft_tokens)
    stats = stats if stats is not None else SpeculativeStats()
    rows = rows if rows is not None else [RowState(params) for _ in range(B)]
    device = idx.device
    generators = row_generators(params.seed, B, device)
    # Room for a whole step's proposals past the last token asked for (discarded there), within both contexts: a
    # step's width then stays the same to the end, and its traced passes (decode/trace.py) with it.
    room = min(end + draft_tokens, model.config.block_size, draft.config.block_size)
    target_cache, draft_cache = target_steps.new_cache(B, room), draft_steps.new_cache(B, room)
    tokens = torch.full((B, end), EOT_TOKEN, dtype=idx.dtype, device=device)  # end-of-text after a row's end
    tokens[:, :T] = idx
    lengths = torch.full((B,), T, device=device)  # tokens each row holds
    active = torch.arange(B, device=device)  # rows still generating, in the caches' order
    emitted = T
    while active.numel() and params.max_new_tokens:
        held, n = tokens[active], lengths[active]
        k = min(draft_tokens, room - int(n.max()))
        proposals, kept, next_token, _ = speculative_step(target_steps, draft_steps, target_cache, draft_cache,
                                                          held, n, k, [params] * active.numel(), generators)
        stats.proposed += k * active.numel()
        stats.accepted += int(kept.sum())
        stats.target_passes += 1
        stats.row_steps += active.numel()

        # Each row takes its kept proposals and the target's token after them, up to the token that ends it.
        stay = []
        for place, (row, proposed, n_kept, after) in enumerate(zip(active.tolist(), proposals.tolist(),
                                                                   kept.tolist(), next_token.tolist())):
            new = proposed[:n_kept] + [after]
            taken = rows[row].accept_all(new)
            start = int(lengths[row])
            tokens[row, start:start + taken] = torch.tensor(new[:taken], dtype=tokens.dtype)
            lengths[row] = start + taken
            if not rows[row].finished:
                stay.append(place)
        if len(stay) < active.numel():
            stay = torch.tensor(stay, dtype=torch.long, device=device)
            active = active[stay]
            generators = [generators[i] for i in stay.tolist()]
            if active.numel():
                target_cache.keep_rows(stay)
                draft_cache.keep_rows(stay)
        if on_token is not None:
            # A column is whole when every row still generating has reached it; finished rows hold end-of-text.
            whole = int(lengths[active].min()) if active.numel() else int(lengths.max())
            for column in range(emitted, whole):
                on_token(tokens[:, column])
            emitted = max(emitted, whole)
    return tokens[:, :int(lengths.max())]
