"""Generate text from a checkpoint folder (float, pruned or int8) or a Hugging Face GPT-2 folder.

    python sample.py --prompt "The history of"                  # the most-trained checkpoint under out/
    echo "Once upon a time" | python sample.py --checkpoint out/train --num-samples 3 --top-p 0.9
    python sample.py --prompts-file prompts.jsonl --output out.jsonl --batch-size 8
    python sample.py --checkpoint out/train --draft out/prune --prompt "The history of"   # speculative

A prompts file holds one JSON object per line: {"prompt": "...", and optionally "max_new_tokens",
"temperature", "top_k", "top_p", "seed", "logit_bias" (an object, as --logit-bias), "presence_penalty",
"frequency_penalty"}; missing settings come from the flags.  Prompts with the same
length and settings are generated together, `--batch-size` at a time, with the KV cache; each output
line has the prompt's line number, text, tokens, finish reason and latency, and is written as soon as its
batch finishes (so lines come in the order they finish, and a crash keeps what was done).  A malformed line
(bad JSON, not UTF-8, a setting of the wrong type) is reported with its number and the others still run.
"""
from __future__ import annotations

if __name__ == "__main__":  # first: a stop sent while the imports below take seconds is noted (runtime/stopping.py)
    from runtime.stopping import note_stops_while_starting
    note_stops_while_starting()

import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from data.tokenizer import decode, encode
from model.config import EOT_TOKEN, GPT2_VOCAB_SIZE
from decode.steps import DECODE_MODES
from decode.generate import CallTiming, generate
from model.packed_linear import pack_for_inference
from decode.row_state import OPENAI_FINISH_REASONS, RowState
from decode.request_sampling import sampling_params
from decode.sampling import SamplingParams
from decode.speculative import DEFAULT_DRAFT_TOKENS, SpeculativeStats
from runtime.cli import check_options, entry_point, flag, option, parse_config
from runtime.device import choose_device
from runtime.errors import UserError
from runtime.parsed import Unparsable, json_value
from runtime.progress import ProgressBar
from runtime.stopping import Stopped
from runtime.text import decode_utf8
from storage.artifact import load_model
from storage.hub import resolve_checkpoint
from storage.run_folder import pick_checkpoint

PROMPT_SETTINGS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "logit_bias", "presence_penalty",
                   "frequency_penalty")
INTEGER_SETTINGS = ("max_new_tokens", "top_k", "seed")
OPTIONAL_SETTINGS = ("top_k", "top_p", "seed", "logit_bias")  # null: no top-k, no nucleus, an unseeded draw, no bias
# torch's generators take seeds in [-2**63, 2**64); row i of a batch draws from seed + i.
SEED_LIMIT = 2**63


class SampleError(UserError, ValueError):
    pass


@dataclass
class SampleConfig:
    checkpoint: str | None = option(None, "artifact folder or hub name (default: the "
                                          "train.py checkpoint under out/ trained on the "
                                          "most tokens)")
    prompt: str | None = option(None, "prompt text (default: standard input when it is "
                                      "not a terminal)")
    prompt_file: str | None = option(None, "read one prompt from this file")
    prompts_file: str | None = option(None, "JSONL of prompts (and optional settings) to "
                                            "generate in batches; see above")
    output: str | None = option(None, "with --prompts-file: write the results as JSONL "
                                      "here (default: standard output)")
    batch_size: int = option(8, "with --prompts-file: prompts decoded together", min=1)
    num_samples: int = option(1, "samples of the prompt", min=1)
    max_new_tokens: int = option(100, "tokens to generate per sample", min=1)
    temperature: float = option(0.8, "0 (or below 1e-4) for greedy decoding")
    top_k: int | None = option(200, "sample among the k most likely tokens")
    top_p: float | None = option(None, "nucleus sampling: the smallest set of tokens "
                                       "holding this probability")
    seed: int = option(1337, "random seed (sample i uses seed + i)")
    logit_bias: str | None = option(None, "added to tokens' logits before sampling, OpenAI's logit_bias as JSON: "
                                          "'{\"50256\": -100}' bans end-of-text; each bias in [-100, 100]")
    presence_penalty: float = option(0.0, "subtracted from the logit of each token the sample has generated so far "
                                          "(OpenAI's presence_penalty), in [-2, 2]")
    frequency_penalty: float = option(0.0, "subtracted from a token's logit once per time the sample has generated "
                                           "it so far (OpenAI's frequency_penalty), in [-2, 2]")
    device: str = option("auto", "auto, cpu, cuda, ...")
    decode: str = option("auto", "how cached decode steps run: auto (the fastest for the device: traced on the "
                                 "CPU, cuda-graph on CUDA, where speculative steps run eagerly), dynamic (eager, "
                                 "the keys grow), static (fixed shapes), cuda-graph (static, each step replayed as "
                                 "a captured CUDA graph: fewer kernel launches at small batch on a GPU), traced "
                                 "(dynamic, each step one traced TorchScript graph with no Python between "
                                 "operators, after a trace per batch size, logged with its time); the tokens are "
                                 "the same",
                         choices=DECODE_MODES)
    draft: str | None = option(None, "speculative decoding: a smaller model with the same vocabulary (artifact "
                                     "folder or hub name, e.g. a pruned checkpoint of this one) proposes tokens "
                                     "that the model checks in one pass; greedy tokens are the model's own, sampled "
                                     "ones follow its distribution; prints the acceptance rate")
    draft_tokens: int = option(DEFAULT_DRAFT_TOKENS, "with --draft: tokens the draft proposes per step; the default "
                                                     "is the count Chen et al. (2023) used, the best one depending "
                                                     "on the draft's acceptance rate and cost (python -m "
                                                     "bench.experiments speculative measures them)", min=1)

    def __post_init__(self):
        if sum(x is not None for x in (self.prompt, self.prompt_file, self.prompts_file)) > 1:
            raise SampleError("give one of --prompt, --prompt-file and --prompts-file")
        if self.output is not None and self.prompts_file is None:
            raise SampleError("--output writes the results of --prompts-file; give one, or drop --output")
        check_options(self, SampleError)
        for name in ("prompt_file", "prompts_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise SampleError(f"{flag(name)} {path} is not a file")
        try:
            self.sampling()
        except UserError as e:
            raise SampleError(f"--{str(e).replace('_', '-')}") from e

    def sampling(self, **overrides) -> SamplingParams:
        """The settings of the flags, overridden by a prompts file line's (decode/request_sampling.py maps them as
        it maps the server's)."""
        settings = {**{k: getattr(self, k) for k in PROMPT_SETTINGS}, **overrides}
        if settings["seed"] is not None and not -SEED_LIMIT <= settings["seed"] < SEED_LIMIT:
            raise SampleError(f"seed must be in [-2**63, 2**63), got {settings['seed']}")
        if isinstance(settings["logit_bias"], str):  # the flag's JSON text
            try:
                settings["logit_bias"] = json_value(settings["logit_bias"])
            except Unparsable as e:
                raise SampleError(f"logit_bias is not JSON ({e}); write an object of token ids and biases, e.g. "
                                  f"'{{\"50256\": -100}}'") from e
        if not isinstance(settings["logit_bias"], dict | None):
            raise SampleError(f"logit_bias must be an object of token ids and biases, e.g. {{\"50256\": -100}}, "
                              f"got {json.dumps(settings['logit_bias'])}")
        return sampling_params(settings, GPT2_VOCAB_SIZE, speculative=self.draft is not None)


def read_bytes(path: str, flag: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise SampleError(f"{flag} {path} cannot be read: {e.strerror}") from e


def read_prompt(cfg: SampleConfig) -> str:
    if cfg.prompt is not None:
        return cfg.prompt
    if cfg.prompt_file is not None:
        return decode_utf8(read_bytes(cfg.prompt_file, "--prompt-file"), cfg.prompt_file, "save it as UTF-8",
                           SampleError)
    if not sys.stdin.isatty():
        return decode_utf8(sys.stdin.buffer.read(), "standard input", "save it as UTF-8", SampleError)
    return "\n"


@dataclass
class CallSpeed:
    """A generate() call's time as the scorecard (bench/leaderboard.py) divides it: the wait for the first new
    tokens (the prompt's prefill), then the decoding rate over the steps after it, with the call's one-time set-up
    (a trace of the decode step, made once per process and shape) taken out of it and reported on its own.  The
    rate is the scorecard's `ms_per_token_batch_1` as tokens per second; its headline figure also spreads the
    prefill over the tokens, which over its hundreds of tokens moves it little."""
    rows: int
    steps: int  # columns of new tokens
    first_token_s: float  # from the call's start, set-up before the first tokens included
    setup_before_first_token_s: float
    setup_s: float  # in all
    decode_s: float  # from the first tokens to the last, less the set-up in between

    @classmethod
    def of(cls, rows: int, start: float, step_times: list[float], timing: CallTiming) -> CallSpeed:
        """From the call's start and the time each column of new tokens came (perf_counter), and its set-up."""
        setup_after_first = timing.setup_s - timing.setup_before_first_token_s
        return cls(rows, len(step_times), step_times[0] - start, timing.setup_before_first_token_s, timing.setup_s,
                   step_times[-1] - step_times[0] - setup_after_first)

    @property
    def tokens_per_s(self) -> float | None:
        return self.rows * (self.steps - 1) / self.decode_s if self.steps > 1 and self.decode_s > 0 else None

    def line(self) -> str:
        setup_first = f" + {self.setup_before_first_token_s * 1e3:,.0f} ms of set-up" \
            if self.setup_before_first_token_s else ""
        first = f"the first after {self.first_token_s * 1e3:,.0f} ms (the prompt{setup_first})"
        if self.tokens_per_s is None:
            return f"{self.rows * self.steps} new tokens (batch {self.rows}): {first}"
        setup = f", not counting {self.setup_s * 1e3:,.0f} ms of one-time set-up (tracing decode steps)" \
            if self.setup_s else ""
        return (f"{self.rows * self.steps} new tokens (batch {self.rows}): {first}, then {self.tokens_per_s:,.1f} "
                f"tokens/s over the {self.steps - 1} steps after it{setup}")


def sample_one(cfg: SampleConfig, model, device, draft=None) -> None:
    prompt_ids = encode(read_prompt(cfg)) or [EOT_TOKEN]
    params = cfg.sampling()
    stats, timing, step_times = SpeculativeStats(), CallTiming(), []
    start = time.perf_counter()
    rows = [RowState(params) for _ in range(cfg.num_samples)]
    generate(model, torch.tensor([prompt_ids] * cfg.num_samples, device=device), params, decode=cfg.decode,
             draft=draft, draft_tokens=cfg.draft_tokens, stats=stats, timing=timing, rows=rows,
             on_token=lambda _: step_times.append(time.perf_counter()))
    for i, row in enumerate(rows):
        print(f"--- sample {i + 1} ---")
        print(decode(prompt_ids) + decode(row.tokens))
    print(f"--- {CallSpeed.of(cfg.num_samples, start, step_times, timing).line()}", file=sys.stderr)
    if draft is not None:
        print(stats.summary(), file=sys.stderr)


def line_settings(entry: dict) -> dict:
    """The line's settings, each checked to be what its flag takes: JSON also allows "7", 2.5, 1e30 and NaN."""
    settings = {k: entry[k] for k in PROMPT_SETTINGS if k in entry}
    for key, value in settings.items():
        if value is None and key in OPTIONAL_SETTINGS:
            continue
        if key == "logit_bias":  # an object: checked with the flag's
            continue
        kinds = (int,) if key in INTEGER_SETTINGS else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):  # bool is an int to Python, not to the user
            wanted = "an integer" if key in INTEGER_SETTINGS else "a number"
            raise SampleError(f"{key} must be {wanted}{' or null' if key in OPTIONAL_SETTINGS else ''}, "
                              f"got {shown(value)}")
        if isinstance(value, int) and key != "seed" and value.bit_length() > (64 if key in INTEGER_SETTINGS else 1000):
            # far past every bound: a count torch takes as a C integer, or a number no float holds past 1024 bits
            # (the seed's own check names its range)
            raise SampleError(f"{key} is out of range, got {shown(value)}")
    return settings


def shown(value) -> str:
    """A JSON value as a message shows it, cut short: a line may hold a number of thousands of digits."""
    text = json.dumps(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def read_prompt_line(cfg: SampleConfig, raw: bytes) -> tuple[list[int], SamplingParams]:
    try:
        entry = json_value(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise SampleError(f"not UTF-8: byte 0x{raw[e.start]:02x} at column {e.start + 1}; save the file as "
                          f"UTF-8") from e
    except Unparsable as e:
        raise SampleError(f"not JSON: {e}") from e
    if not isinstance(entry, dict) or not isinstance(entry.get("prompt"), str):
        raise SampleError('expected an object with a "prompt" string')
    unknown = set(entry) - {"prompt", *PROMPT_SETTINGS}
    if unknown:
        raise SampleError(f"unknown keys {sorted(unknown)}; known: prompt, {', '.join(PROMPT_SETTINGS)}")
    return encode(entry["prompt"]) or [EOT_TOKEN], cfg.sampling(**line_settings(entry))


def read_prompts(cfg: SampleConfig) -> tuple[list[tuple[int, list[int], SamplingParams]], list[dict]]:
    """(line number, prompt tokens, settings) of every good line, and an error record for every bad one.

    The file is split into lines as bytes, so a byte that is not UTF-8 costs only its line, and line numbers
    are an editor's (str.splitlines would also split at U+2028 and other separators inside a JSON string)."""
    jobs, errors = [], []
    for number, raw in enumerate(read_bytes(cfg.prompts_file, "--prompts-file").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            jobs.append((number, *read_prompt_line(cfg, raw)))
        except UserError as e:
            errors.append({"line": number, "error": str(e)})
            print(f"{cfg.prompts_file}:{number}: skipped: {e}", file=sys.stderr)
    return jobs, errors


@contextlib.contextmanager
def open_output(cfg: SampleConfig):
    """Where results go, opened before any work, so that a path that cannot be written fails at once."""
    if cfg.output is None:
        yield sys.stdout
        return
    try:
        Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
        out = open(cfg.output, "w", encoding="utf-8")
    except OSError as e:
        raise SampleError(f"--output {cfg.output} cannot be written ({e.strerror}); name a file in a folder "
                          f"you can write to") from e
    with out:
        yield out


def sample_many(cfg: SampleConfig, model, device, out, draft=None) -> None:
    written = []  # the line number of each result written

    def write(result: dict) -> None:  # at once: a later crash keeps every line already done
        out.write(json.dumps(result) + "\n")
        out.flush()
        written.append(result["line"])

    try:
        sample_batches(cfg, model, device, write, draft)
    except KeyboardInterrupt as e:  # SIGINT or SIGTERM (runtime/stopping.py): the entry point prints the line
        raise Stopped.of(e).saying(f"after {len(written)} results; {cfg.output or 'standard output'} holds them, "
                                   f"one whole line each") from None


def sample_batches(cfg: SampleConfig, model, device, write, draft=None) -> None:

    jobs, errors = read_prompts(cfg)
    for error in errors:
        write(error)
    groups: dict[tuple, list] = {}  # same length and settings: one batch shape, one call to generate
    for job in jobs:
        number, ids, params = job
        groups.setdefault((len(ids), tuple(getattr(params, k) for k in PROMPT_SETTINGS)), []).append(job)
    failed = len(errors)
    stats = SpeculativeStats()  # summed over batches
    with ProgressBar(total=len(jobs), desc="prompts", unit="prompt", file=sys.stderr) as bar:
        for group in groups.values():
            for first in range(0, len(group), cfg.batch_size):
                batch = group[first:first + cfg.batch_size]
                params = batch[0][2]
                start = time.perf_counter()
                rows = [RowState(params) for _ in batch]
                try:
                    generate(model, torch.tensor([ids for _, ids, _ in batch], device=device), params,
                             decode=cfg.decode, draft=draft, draft_tokens=cfg.draft_tokens, stats=stats, rows=rows)
                except UserError as e:  # e.g. a prompt too long for the context: these lines alone fail
                    for number, _, _ in batch:
                        write({"line": number, "error": str(e)})
                    failed += len(batch)
                    bar.update(len(batch))
                    continue
                latency = time.perf_counter() - start
                for (number, _, _), row in zip(batch, rows):
                    write({"line": number, "text": decode(row.tokens), "tokens": row.tokens,
                           "finish_reason": OPENAI_FINISH_REASONS[row.finish_reason], "latency_s": round(latency, 4)})
                bar.update(len(batch))
    if draft is not None:
        print(stats.summary(), file=sys.stderr)
    if cfg.output:
        print(f"wrote {len(jobs) + len(errors)} results ({failed} errors) to {cfg.output}", file=sys.stderr)


@entry_point(interrupted="before its samples were complete")
def main(argv=None) -> None:
    cfg = parse_config(SampleConfig, __doc__, argv)
    with open_output(cfg) as out:
        folder, why = pick_checkpoint(cfg.checkpoint)
        # The draft's name too, before the model loads: a typo must not cost the wait for the model.
        draft_folder = None if cfg.draft is None else resolve_checkpoint(cfg.draft, "--draft")
        print(f"model: {folder} ({why})", file=sys.stderr)
        device = choose_device(cfg.device)
        if cfg.decode == "cuda-graph" and device.type != "cuda":
            raise SampleError(f"--decode cuda-graph needs a CUDA device, and this run is on {device}; use "
                              f"--decode dynamic")
        model, meta = load_model(folder, device)
        print(f"loaded {meta.kind} model from {folder}; {pack_for_inference(model)}", file=sys.stderr)
        draft = None
        if draft_folder is not None:
            draft, draft_meta = load_model(draft_folder, device)
            print(f"loaded {draft_meta.kind} draft model from {cfg.draft}; {pack_for_inference(draft)}",
                  file=sys.stderr)
        if cfg.prompts_file:
            sample_many(cfg, model, device, out, draft)
        else:
            sample_one(cfg, model, device, draft)


if __name__ == "__main__":
    main()
