"""One side of bench/standalone/serve_cpu_split.py: the server in this process, and the CPU each of its threads
spends per streamed token.

    python bench/standalone/serve_cpu_side.py measure SETTINGS_JSON            # prints one JSON line
    python bench/standalone/serve_cpu_side.py clients URL MODEL CLIENTS REQUESTS NEW_TOKENS

serve_cpu_split.py runs it with the code under test first on PYTHONPATH (this checkout's or a baseline's), so it
uses only what both have: create_app, generate(), the load test's client.

`measure` times generate() alone first, on a thread of its own that ends with it (as the server loads its model
off the main thread): the calling thread's CPU per token at each batch size, a traced step's matmul share included
(torch runs the calling thread as one of its intra-op workers).  Then it serves the artifact with uvicorn in the
main thread, so that the event loop is the main thread, and for each level streams `requests` /v1/completions
requests per client from `clients` clients at once (a process of their own, the `clients` mode): the CPU the event
loop's thread and the engine's thread spent over the level, read from /proc/self/task/TID/schedstat (nanoseconds on
a core), over the tokens served, and the CPU the clients' process spent streaming them.  One untimed one-client
level comes first.

Every thread's CPU inside the model's passes (DecodeSteps.logits, the prompt's and each step's: what both sides
run alike, and where torch's intra-op work lands on the calling thread) is counted apart too, so that the engine's
bookkeeping, and generate()'s, can be read directly: the thread's CPU outside its passes.
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import uvicorn

from bench.eval.loadtest import checked, completion_body, run_level
from decode.generate import generate
from decode.sampling import SamplingParams
from decode.steps import DecodeSteps
from model.packed_linear import pack_for_inference
from serve.app import create_app
from serve.config import ServeConfig
from serve.launch import LOOPBACK, free_port
from storage.artifact import load_model

PROMPT_TOKENS = 32  # the prompt each request and generate() row continues: token ids 1000..1031
REQUEST_TIMEOUT_S = 600.0


def prompt_ids() -> list[int]:
    return list(range(1000, 1000 + PROMPT_TOKENS))


def thread_cpu_s(tid: int) -> float:
    """Seconds thread `tid` of this process has run on a core (the scheduler's own count, in nanoseconds)."""
    return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]) / 1e9


class PassClock:
    """Each thread's CPU inside DecodeSteps.logits, once `install`ed (a wrapper around it)."""

    def __init__(self):
        self.seconds: dict[int, float] = collections.defaultdict(float)

    def install(self) -> None:
        passes = DecodeSteps.logits

        def timed(steps, *args, **kwargs):
            start = time.thread_time()
            try:
                return passes(steps, *args, **kwargs)
            finally:
                self.seconds[threading.get_native_id()] += time.thread_time() - start

        DecodeSteps.logits = timed


PASSES = PassClock()


def generate_cpu_per_token_ms(artifact: Path, batch: int, new_tokens: int, decode: str) -> tuple[float, float]:
    """The calling thread's CPU per token of generate() at `batch` rows, after one untimed call (its trace): in
    all, and inside the model's passes."""
    model, _ = load_model(artifact, torch.device("cpu"))
    pack_for_inference(model)
    idx = torch.tensor([prompt_ids()] * batch)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, stop_at_eot=False)

    def timed() -> tuple[float, float]:
        with torch.inference_mode():
            generate(model, idx, params, decode=decode)
            start, in_passes = time.thread_time(), PASSES.seconds[threading.get_native_id()]
            generate(model, idx, params, decode=decode)
            return time.thread_time() - start, PASSES.seconds[threading.get_native_id()] - in_passes

    with ThreadPoolExecutor(max_workers=1) as pool:  # a thread, and its OpenMP pool, that end with the call
        seconds, in_passes = pool.submit(timed).result()
    return 1000 * seconds / (batch * new_tokens), 1000 * in_passes / (batch * new_tokens)


def stream_clients(url: str, model: str, clients: int, requests: int, new_tokens: int) -> float:
    """`clients` streaming clients at once, `requests` each, every request exactly `new_tokens` tokens: the CPU
    seconds this process spent on them (the load test's client, on the same cores as the server)."""
    start = time.process_time()
    level = asyncio.run(run_level(url, clients, clients * requests, new_tokens, REQUEST_TIMEOUT_S, REQUEST_TIMEOUT_S,
                                  body=lambda i, n: completion_body(model, prompt_ids(), n),
                                  route="/v1/completions"))
    seconds = time.process_time() - start
    checked(level, new_tokens)
    return seconds


def serve_levels(artifact: Path, settings: dict) -> list[dict]:
    """Per level: the event loop's and the engine thread's CPU per token served, and the engine's inside the
    model's passes, in ms."""
    config = ServeConfig(checkpoint=str(artifact), host=LOOPBACK, port=free_port(), decode=settings["decode"],
                         max_batch_size=max(settings["clients"]))
    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                           access_log=False, ws="none"))
    url, model = f"http://{config.host}:{config.port}", app.state.server.model_id
    loop_tid = threading.main_thread().native_id
    levels: list[dict] = []
    failed: list[BaseException] = []

    def drive() -> None:
        try:
            while not server.started:
                time.sleep(0.05)
            engine_tid = app.state.server.engine.thread.native_id
            for clients in [1, *settings["clients"]]:  # the first, untimed
                before = thread_cpu_s(loop_tid), thread_cpu_s(engine_tid), PASSES.seconds[engine_tid]
                streamed = subprocess.run([sys.executable, __file__, "clients", url, model, str(clients),
                                           str(settings["requests"]), str(settings["new_tokens"])], check=True,
                                          stdout=subprocess.PIPE, text=True)
                after = thread_cpu_s(loop_tid), thread_cpu_s(engine_tid), PASSES.seconds[engine_tid]
                tokens = clients * settings["requests"] * settings["new_tokens"]
                levels.append({"clients": clients, "tokens": tokens,
                               "client_ms": 1000 * float(streamed.stdout.split()[-1]) / tokens,
                               "event_loop_ms": 1000 * (after[0] - before[0]) / tokens,
                               "engine_ms": 1000 * (after[1] - before[1]) / tokens,
                               "engine_passes_ms": 1000 * (after[2] - before[2]) / tokens})
        except BaseException as e:  # raised again in the main thread, once the server has stopped
            failed.append(e)
        finally:
            server.should_exit = True

    driver = threading.Thread(target=drive, name="serve-cpu-driver", daemon=True)
    driver.start()
    server.run()
    driver.join()
    if failed:
        raise failed[0]
    return levels[1:]


def measure(settings: dict) -> dict:
    artifact = Path(settings["artifact"])
    PASSES.install()
    generate_ms = {str(batch): generate_cpu_per_token_ms(artifact, batch, settings["new_tokens"], settings["decode"])
                   for batch in settings["clients"]}
    return {"generate_ms": {batch: ms for batch, (ms, _) in generate_ms.items()},
            "generate_passes_ms": {batch: ms for batch, (_, ms) in generate_ms.items()},
            "levels": serve_levels(artifact, settings),
            "load_average_1m": os.getloadavg()[0]}


if __name__ == "__main__":
    if sys.argv[1] == "measure":
        print(json.dumps(measure(json.loads(sys.argv[2]))), flush=True)
    elif sys.argv[1] == "clients":
        url, model, clients, requests, new_tokens = sys.argv[2:]
        print(stream_clients(url, model, int(clients), int(requests), int(new_tokens)), flush=True)
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}: measure or clients")
