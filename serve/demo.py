"""The last step of `make demo`: start the server on a checkpoint, send one request, print the reply and its latency.

    python -m serve.demo --checkpoint out/demo/train
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from runtime.cli import entry_point, option, parse_config
from runtime.errors import UserError
from serve.launch import running_server
from storage.run_folder import pick_checkpoint


@dataclass
class DemoConfig:
    checkpoint: str | None = option(None, "artifact folder to serve (default: the train.py checkpoint under out/ trained on the most tokens)")
    prompt: str = option("The module", "the one prompt sent")
    max_new_tokens: int = option(40, "tokens generated for it")
    seed: int = option(1, "sampling seed (temperature 0.8, top-k 200)")


class DemoError(UserError):
    pass


def demo(args: DemoConfig) -> None:
    folder, why = pick_checkpoint(args.checkpoint)
    if not folder.is_dir():
        raise DemoError(f"checkpoint folder {folder} does not exist; train one first (`make demo` does)")
    print(f"model: {folder} ({why})")
    request = {"prompt": args.prompt, "max_new_tokens": args.max_new_tokens, "temperature": 0.8, "top_k": 200,
               "seed": args.seed}
    with tempfile.TemporaryDirectory() as tmp, \
            running_server(folder, Path(tmp) / "server.log") as server:
        print(f"server on {server.url} serving {folder}; POST /generate {request}")
        start = time.perf_counter()
        response = httpx.post(f"{server.url}/generate", json=request, timeout=120)
        client_ms = 1000 * (time.perf_counter() - start)
        if response.status_code != 200:
            raise DemoError(f"the server answered {response.status_code}: {response.text}\n{server.log()}")
        reply = response.json()
        latency = reply["latency"]
        print(f"--- reply ({reply['tokens']} tokens, finish_reason={reply['finish_reason']}) ---")
        print(args.prompt + reply["text"])
        print(f"--- latency: queue {latency['queue_ms']:.1f} ms, first token {latency['time_to_first_token_ms']:.1f} ms, "
              f"total {latency['total_ms']:.1f} ms ({latency['tokens_per_s']:.1f} tokens/s); "
              f"round trip seen by the client {client_ms:.1f} ms")
    print("server stopped")


@entry_point
def main(argv=None) -> None:
    demo(parse_config(DemoConfig, __doc__, argv))


if __name__ == "__main__":
    main()
