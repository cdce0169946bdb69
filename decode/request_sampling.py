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

from decode.sampling import MAX_LOGIT_BIAS, SamplingError, SamplingParams

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
        token = key if isinstance(key, int) and not isinstance(key, bool) and key >= 0 else \
            _decimal_id(key, vocab_size) if isinstance(key, str) and key.isascii() and key.isdigit() else None
        if token is None:
            raise SamplingError(f"logit_bias: key {_shown(key)} is not a token id; write each id as a decimal "
                                f"string, e.g. {{\"50256\": -100}}", "logit_bias")
        if token >= vocab_size:
            raise SamplingError(f"logit_bias: token id {_shown(key)} is outside the vocabulary; ids run from 0 to "
                                f"{vocab_size - 1}", "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                isinstance(value, int) and value.bit_length() > 64:  # past any bias, and float() may refuse it
            raise SamplingError(f"logit_bias: the bias of token {token} must be a number in [-{MAX_LOGIT_BIAS:g}, "
                                f"{MAX_LOGIT_BIAS:g}], got {_shown(value) if isinstance(value, int) else repr(value)}",
                                "logit_bias")
        if token in pairs:  # "7" and "007" name the same token
            raise SamplingError(f"logit_bias: token id {token} is given twice", "logit_bias")
        pairs[token] = float(value)
    return tuple(sorted(pairs.items()))


def _decimal_id(digits: str, vocab_size: int) -> int:
    """The id the decimal string `digits` names, or `vocab_size` (outside the vocabulary) for one with more digits
    than any id has: int() refuses a string of over 4,300 digits, and a long one costs time."""
    significant = digits.lstrip("0") or "0"  # "007" names token 7
    return int(significant) if len(significant) <= len(str(vocab_size)) else vocab_size


def _shown(key: str | int) -> str:
    """A key as the request wrote it, cut short: a key may be thousands of characters (or an int of as many
    digits, which str() refuses past 4,300)."""
    if isinstance(key, int):
        text = str(key) if key.bit_length() <= 14_000 else f"<an integer of {key.bit_length()} bits>"
    else:
        text = (key.lstrip("0") or "0") if key.isascii() and key.isdigit() else repr(key)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
