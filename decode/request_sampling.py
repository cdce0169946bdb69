"""One mapping from a request's sampling knobs to SamplingParams, for every door: the server's /generate and
/v1/completions and sample.py (its flags and its prompts file's lines).

Each door checks its own documented bounds first (the server's pydantic schemas, sample.py's flags; /generate
allows temperatures to 10, /v1/completions to OpenAI's 2), and names the knobs as SAMPLING_FIELDS does; this turns
them into SamplingParams the same way everywhere: `ignore_eos` into not stopping at end-of-text, and `logit_bias`'s
keys (token ids as decimal strings, as JSON and OpenAI's API write them) into ids within the vocabulary.  A knob
that cannot be honoured raises SamplingError naming it.
"""
from __future__ import annotations

from typing import Any, Mapping

from decode.sampling import SamplingError, SamplingParams

SAMPLING_FIELDS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "ignore_eos", "logit_bias",
                   "presence_penalty", "frequency_penalty")
# OpenAI's completions API takes at most this many logit_bias entries; each costs a little every step.
MAX_LOGIT_BIAS_ENTRIES = 300


def sampling_params(fields: Mapping[str, Any], vocab_size: int, speculative: bool = False) -> SamplingParams:
    """SamplingParams from `fields` (named as SAMPLING_FIELDS; a missing one takes SamplingParams' default, a
    None top_k, top_p or seed means none).  `vocab_size`: the ids a bias may name; `speculative`: the door decodes
    with a draft model, whose checks of proposals do not apply biases or penalties (refused)."""
    unknown = set(fields) - set(SAMPLING_FIELDS)
    if unknown:
        raise TypeError(f"not sampling fields: {sorted(unknown)}")
    settings = {k: v for k, v in fields.items() if k not in ("ignore_eos", "logit_bias")}
    if fields.get("top_p") == 1.0:
        settings["top_p"] = None  # the whole distribution: no nucleus pass
    params = SamplingParams(**settings, stop_at_eot=not fields.get("ignore_eos", False),
                            logit_bias=logit_bias(fields.get("logit_bias"), vocab_size))
    if speculative and params.adjusts_logits:
        field = "logit_bias" if params.logit_bias else \
            "presence_penalty" if params.presence_penalty else "frequency_penalty"
        raise SamplingError(f"{field} is not available with speculative decoding (a draft model): leave it out, or "
                            f"use a server or sample.py run without --draft", field)
    return params


def logit_bias(bias: Mapping[str | int, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} as SamplingParams' (id, bias) pairs, ids ascending."""
    if not bias:
        return ()
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise SamplingError(f"logit_bias has {len(bias)} entries; at most {MAX_LOGIT_BIAS_ENTRIES} are allowed",
                            "logit_bias")
    pairs = {}
    for key, value in bias.items():
        token = key if isinstance(key, int) and not isinstance(key, bool) else \
            int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else None
        if token is None:
            raise SamplingError(f"logit_bias: key {key!r} is not a token id; write each id as a decimal string, "
                                f"e.g. {{\"50256\": -100}}", "logit_bias")
        if token >= vocab_size:
            raise SamplingError(f"logit_bias: token id {token} is outside the vocabulary; ids run from 0 to "
                                f"{vocab_size - 1}", "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SamplingError(f"logit_bias: the bias of token {token} must be a number, got {value!r}",
                                "logit_bias")
        if token in pairs:  # "7" and "007" name the same token
            raise SamplingError(f"logit_bias: token id {token} is given twice", "logit_bias")
        pairs[token] = float(value)
    return tuple(sorted(pairs.items()))
