"""The server's settings: one typed dataclass, filled from the command line by `python -m serve`."""
from __future__ import annotations

import os
from dataclasses import dataclass

from decode.steps import DECODE_MODES
from decode.speculative import DEFAULT_DRAFT_TOKENS
from serve.runner import ASYNC_STEPS
from runtime.cli import check_options, option
from runtime.errors import UserError

WARM_UP_CHOICES = ("all-rows", "one-row")
# The environment variable that, when set, holds the API key every generation request must present: one key, or
# several separated by commas, one per client (each key's requests get prefix-cache blocks of their own).
API_KEY_ENV = "GPT2_SERVE_API_KEY"
# The environment variable the uvicorn app factory (`uvicorn --factory serve.app:create_app`) reads
# the checkpoint folder from, since a factory takes no arguments.
CHECKPOINT_ENV = "GPT2_SERVE_CHECKPOINT"


class ServeConfigError(UserError, ValueError):
    """A server setting out of range; the message names it."""


def api_keys_from_environment() -> tuple[str, ...]:
    """The keys a generation request may present (any one of them), none when the variable is unset or empty.

    Refused at startup unless each is printable ASCII with no space or comma in it: HTTP headers carry ASCII
    (Starlette reads them as latin-1), the server strips the presented key, and commas separate the keys, so any
    other key could never match and every request would get 401."""
    value = os.environ.get(API_KEY_ENV) or ""
    keys = tuple(value.split(",")) if value else ()
    for key in keys:
        if not key or not all(" " < c <= "~" for c in key):
            raise ServeConfigError(f"{API_KEY_ENV} must hold keys of printable ASCII with no space, separated by "
                                   f"commas with nothing empty between them (HTTP headers cannot carry anything "
                                   f"else, so no request could present it); choose keys of letters, digits and "
                                   f"punctuation, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return keys


@dataclass
class ServeConfig:
    checkpoint: str | None = option(None, "artifact folder (float, pruned or int8) or hub name; default: the "
                                          "train.py checkpoint under out/ trained on the most tokens")
    served_model_name: str | None = option(None, "the model id /v1/models lists and /v1/completions expects "
                                                 "(default: the artifact folder's name)")
    host: str = option("127.0.0.1", "interface to bind; anything but loopback exposes the server to the network")
    port: int = option(8000, "TCP port (0: any free one)", min=0, max=65535)
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    threads: int | None = option(None, "torch intra-op threads (default: torch's choice); 1 suits small models on a "
                                       "busy CPU", min=1)
    decode: str = option("auto", "how decode steps run, as in sample.py: auto (traced on the CPU, a captured CUDA "
                                 "graph per batch size on a GPU, eager for speculative steps there), traced (each "
                                 "step one TorchScript graph, no Python between its operators), cuda-graph, dynamic "
                                 "(eager PyTorch) or static (eager, fixed shapes)", choices=DECODE_MODES)
    draft: str | None = option(None, "speculative decoding: a smaller model with the same vocabulary and at least "
                                     "the model's context (artifact folder or hub name, e.g. a row-pruned "
                                     "checkpoint of this one) proposes tokens that the model checks in one pass; "
                                     "greedy tokens stay the model's own, sampled ones follow its distribution")
    draft_tokens: int = option(DEFAULT_DRAFT_TOKENS, "with --draft: tokens the draft proposes per step", min=1)
    async_steps: str = option("auto", "launch each decode step before the tokens of the step before are read back "
                                      "and sent, so that the server's work between steps runs while the device "
                                      "computes (vLLM's asynchronous scheduling): auto (on a GPU; off on the CPU, "
                                      "where a step runs in the thread that launches it and nothing would overlap), "
                                      "on or off; not with --draft", choices=ASYNC_STEPS)
    max_batch_size: int = option(16, "sequences decoded together in one forward pass", min=1)
    warm_up: str = option("all-rows", "decode steps made at start-up, before /health says ready: all-rows (a trace or "
                                      "capture per row count the batch is padded to, so that no request waits for "
                                      "one) or one-row (a faster start; each other count is made when a batch first "
                                      "reaches it, in that request's time)", choices=WARM_UP_CHOICES)
    prefix_cache_mb: int | None = option(None, "prefix caching: keep the keys and values of recent prompts, up to "
                                               "this many MiB, for prompts that start with the same tokens "
                                               "(decode/prefix_cache.py; only requests with the same API key and "
                                               "cache_salt share them); default: room for two full contexts of the "
                                               "served model; 0 turns it off (bench/REPORT.md, prefix caching, "
                                               "measures both)", min=0)
    stream_interval_ms: float = option(20.0, "the least time between two hand-overs of streamed tokens to the event "
                                             "loop, whose wake-up and writes take the cores the steps need: tokens "
                                             "made sooner wait for a later step's; first tokens, ends and errors go "
                                             "at once; 0 hands over each step's tokens as it ends", min=0, max=1000)
    max_queue: int = option(64, "requests that may wait for a batch slot before new ones get 503", min=0)
    request_timeout_s: float = option(120.0, "time limit per request, from arrival to the last token, queueing "
                                             "included", above=0)
    max_body_bytes: int = option(64 * 1024, "larger request bodies get 413", min=0)
    read_timeout_s: float = option(10.0, "seconds a client has to send a request's headers, and again its body; "
                                         "slower ones get 408", above=0)
    max_connections: int = option(128, "open connections at once; one more is answered 503 and closed (keep it "
                                       "below the open-file limit)", min=1)
    retry_after_s: int = option(1, "the Retry-After header of a 503", min=1)
    max_completions: int = option(8, "the most completions (prompts x n) one /v1/completions request may ask for",
                                  min=1)
    graceful_shutdown_s: float = option(60.0, "how long Ctrl-C / SIGTERM waits for in-flight requests", above=0)

    def __post_init__(self):
        check_options(self, ServeConfigError)
        if self.async_steps == "on" and self.draft is not None:
            raise ServeConfigError("--async-steps on launches plain steps ahead, and with --draft every step is "
                                   "speculative (each row's kept tokens are read before the next step): leave "
                                   "--async-steps at auto or off with --draft")
