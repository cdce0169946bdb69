"""The serving engine alone (no HTTP, no event loop), its steps launched ahead or read back one at a time, against
generate() on the same model, in interleaved rounds.

    python -m bench.standalone.async_steps --device cuda          # GPT-2 124M, random weights, 128 new tokens
    python -m bench.standalone.async_steps --model tiny --new-tokens 8 --repeats 1 --device cpu   # a quick check

One engine per --async-steps setting runs in this process on its own thread, as the server's does, warmed up as
the server warms it, with the server's default decode steps (a captured CUDA graph per row count on a GPU, traced
on the CPU).  Each round times, for each setting, one request alone and each --clients level (that many requests
submitted at once, each making exactly --new-tokens tokens, sampled as serve_speed's requests are: temperature
0.8, top-k 200, a seed), and generate() at batch 1.  Requests are handed to the engine directly, so the figures are
the engine's own: what launching each step ahead of the host's work (reading back, each row's bookkeeping, the
events) saves, without the HTTP side's share.  serve_speed --async-steps off on times the whole server.  The host's
load is stored with the result; read it beside the figures.  Results: bench/results/async_steps.json.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.record import RESULTS_DIR, write_result
from decode.generate import generate
from decode.sampling import SamplingParams
from model.config import PRESETS, preset
from model.gpt import GPT
from model.packed_linear import pack_for_inference
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.device import choose_device
from runtime.errors import UserError
from runtime.timing import Environment, Spread, environment, paired_ratio, time_interleaved
from serve.engine import Engine
from serve.events import DoneEvent, GenerationRequest
from serve.runner import ASYNC_STEPS

REQUEST_TIMEOUT_S = 600.0
PROMPT_TOKENS = 16


@dataclass
class AsyncStepsConfig:
    model: str = option("gpt2", "model preset (random weights)", choices=tuple(PRESETS))
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    new_tokens: int = option(128, "tokens each request makes", min=1)
    clients: list[int] = option([12], "requests submitted at once, each level beside one request alone", min=2)
    async_steps: list[str] = option(["off", "on"], "the engines' settings, the first the reference",
                                    choices=ASYNC_STEPS)
    repeats: int = option(5, "timed rounds (after one untimed warm-up round)", min=1)
    results_dir: Path = option(RESULTS_DIR, "where async_steps.json goes")

    def __post_init__(self):
        check_options(self, UserError)
        if len(set(self.async_steps)) != len(self.async_steps):
            raise UserError(f"--async-steps names a setting twice: {' '.join(self.async_steps)}")
        if PROMPT_TOKENS + self.new_tokens > preset(self.model).block_size:
            raise UserError(f"--new-tokens {self.new_tokens} and the {PROMPT_TOKENS}-token prompt exceed the "
                            f"{self.model} context of {preset(self.model).block_size}")


@dataclass
class Side:
    async_steps: str
    tokens_per_s: dict[str, Spread]  # by level ("1 request", "12 requests")
    over_first: dict[str, float] | None  # this setting's speed over the first's, paired rounds (None: the first)


@dataclass
class AsyncSteps:
    model: str
    new_tokens: int
    generate_tokens_per_s: Spread
    sides: list[Side]
    one_request_over_generate: dict[str, float]  # by setting
    environment: Environment


def params(seed: int, new_tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=new_tokens, temperature=0.8, top_k=200, seed=seed, stop_at_eot=False)


def requests_through(engine: Engine, count: int, new_tokens: int) -> None:
    """`count` requests submitted at once; returns when every one has its reply."""
    done = threading.Semaphore(0)
    for i in range(count):
        def on_event(event, i=i):
            if isinstance(event, DoneEvent):
                done.release()
            elif not hasattr(event, "token"):
                raise RuntimeError(f"request {i} failed: {event}")
        prompt = [(7 + 31 * i + 13 * j) % 50000 for j in range(PROMPT_TOKENS)]
        engine.submit(GenerationRequest(prompt, params(i, new_tokens), on_event))
    for _ in range(count):
        if not done.acquire(timeout=REQUEST_TIMEOUT_S):
            raise RuntimeError("a request did not end in time")


def level(n: int) -> str:
    return f"{n} request{'s' if n > 1 else ''}"


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(AsyncStepsConfig, __doc__, argv)
    device = choose_device(cfg.device)
    torch.manual_seed(0)
    model = GPT(preset(cfg.model)).to(device).eval()
    pack_for_inference(model)
    counts = [1, *cfg.clients]
    engines = {}
    for setting in cfg.async_steps:
        engine = engines[setting] = Engine(model, device, max(cfg.clients), max(cfg.clients), REQUEST_TIMEOUT_S,
                                           async_steps=setting)
        engine.start(warm_up_all_rows=True)
    idx = torch.tensor([[(7 + 13 * j) % 50000 for j in range(PROMPT_TOKENS)]], device=device)
    calls = {("generate", 1): lambda: generate(model, idx, params(0, cfg.new_tokens))}
    for setting, engine in engines.items():
        calls.update({(setting, n): (lambda engine=engine, n=n: requests_through(engine, n, cfg.new_tokens))
                      for n in counts})
    try:
        seconds = time_interleaved(calls, cfg.repeats, warmup=1, device=device, progress="async_steps rounds")
    finally:
        for engine in engines.values():
            engine.stop()
    first = cfg.async_steps[0]
    sides = [Side(setting, {level(n): Spread.of([n * cfg.new_tokens / s for s in seconds[setting, n]])
                            for n in counts},
                  None if setting == first else {level(n): paired_ratio(seconds[first, n], seconds[setting, n])
                                                 for n in counts})
             for setting in cfg.async_steps]
    result = AsyncSteps(cfg.model, cfg.new_tokens, Spread.of([cfg.new_tokens / s for s in seconds["generate", 1]]),
                        sides, {setting: paired_ratio(seconds["generate", 1], seconds[setting, 1])
                                for setting in cfg.async_steps}, environment(device))
    print(f"generate(): {result.generate_tokens_per_s.median:.1f} new tokens/s")
    for side in sides:
        print(f"async steps {side.async_steps}: "
              + ", ".join(f"{name} {spread.median:.1f} new tokens/s" for name, spread in side.tokens_per_s.items())
              + f"; one request {result.one_request_over_generate[side.async_steps]:.2f}x generate()"
              + ("" if side.over_first is None else
                 "; over " + first + ": " + ", ".join(f"{k} {v:.2f}x" for k, v in side.over_first.items())))
    write_result(cfg.results_dir, "async_steps", result)


if __name__ == "__main__":
    main()
