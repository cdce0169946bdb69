"""Start `python -m serve` as a child process on a free loopback port, wait until it answers, always stop it.

Used by the demo, the load test and the tests, which all need a real server with a real port.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx

LOOPBACK = "127.0.0.1"
HEALTH_POLL_S = 0.05  # between /health tries while the server starts


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m serve` on `checkpoint`; or, from `start`, any server that answers GET /health with 200 once it
    is ready (bench/peers/llama_cpp_peer.py starts llama.cpp's llama-server so)."""

    def __init__(self, checkpoint: str | Path, log_path: str | Path, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self._start([sys.executable, "-m", "serve", "--checkpoint", str(checkpoint), "--host", LOOPBACK,
                     "--port", str(self.port), *(extra_args or [])], log_path, env)

    @classmethod
    def start(cls, command: list[str], log_path: str | Path) -> ServerProcess:
        """`command` with `{host}` and `{port}` in its arguments filled in with a free loopback port."""
        server = cls.__new__(cls)
        server.port = free_port()
        server.url = f"http://{LOOPBACK}:{server.port}"
        server._start([arg.format(host=LOOPBACK, port=server.port) for arg in command], log_path, None)
        return server

    def _start(self, command: list[str], log_path: str | Path, env: dict[str, str] | None) -> None:
        self.log_path = Path(log_path)
        self.log_file = open(self.log_path, "w")
        self.process = subprocess.Popen(command, stdout=self.log_file, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})})

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_until_healthy(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        # One client for every try: httpx.get builds a client, and with it an SSL context (CPU time spent loading
        # the CA bundle), on each call, taken from the starting server on a small machine.
        with httpx.Client(timeout=2, verify=False) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the server exited with code {self.process.returncode}:\n{self.log()}")
                try:
                    response = client.get(f"{self.url}/health")
                    if response.status_code == 200:
                        return response.json()
                except httpx.TransportError:
                    pass
                time.sleep(HEALTH_POLL_S)
        raise RuntimeError(f"the server did not answer /health within {timeout_s:g}s:\n{self.log()}")

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM (uvicorn lets in-flight requests finish), then SIGKILL if it does not exit in time."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_file.close()
        return self.process.returncode


@contextlib.contextmanager
def running(server: ServerProcess, startup_timeout_s: float = 120) -> Iterator[ServerProcess]:
    """`server` once it answers /health, stopped on leaving the block however it is left."""
    try:
        server.wait_until_healthy(startup_timeout_s)
        yield server
    finally:
        server.stop()


def running_server(checkpoint: str | Path, log_path: str | Path, extra_args: list[str] | None = None,
                   env: dict[str, str] | None = None, startup_timeout_s: float = 120):
    """`python -m serve --checkpoint checkpoint` with `extra_args`, as `running` gives it."""
    return running(ServerProcess(checkpoint, log_path, extra_args, env), startup_timeout_s)
