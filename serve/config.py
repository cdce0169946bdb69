"""The server's settings: one typed dataclass, filled from the command line by `python -m serve`."""
from __future__ import annotations

from dataclasses import dataclass

from runtime.errors import UserError

# The environment variable that, when set, holds the API key every generation request must present.
API_KEY_ENV = "GPT2_SERVE_API_KEY"
# The environment variable the uvicorn app factory (`uvicorn --factory serve.app:create_app`) reads
# the checkpoint folder from, since a factory takes no arguments.
CHECKPOINT_ENV = "GPT2_SERVE_CHECKPOINT"


class ServeConfigError(UserError, ValueError):
    """A server setting out of range; the message names it."""


@dataclass
class ServeConfig:
    checkpoint: str | None = None  # artifact folder; None means the newest under out/
    served_model_name: str | None = None  # the model id clients send; None means the artifact folder's name
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "auto"
    threads: int = 0  # torch intra-op threads for generation; 0 keeps torch's default (one per core)
    max_batch_size: int = 16  # sequences decoded together in one forward pass
    max_queue: int = 64  # requests waiting for a batch slot; one more is answered 503
    request_timeout_s: float = 120.0  # from arrival to the last token, queueing included
    max_body_bytes: int = 64 * 1024
    read_timeout_s: float = 10.0  # a client's time to send a request's headers, and again its body; then 408
    max_connections: int = 128  # open connections; one more is answered 503 and closed at once
    retry_after_s: int = 1  # the Retry-After a 503 suggests
    max_completions: int = 8  # the most sequences one /v1/completions request may ask for (n x prompts)
    graceful_shutdown_s: float = 60.0  # how long shutdown waits for in-flight requests

    def __post_init__(self):
        for name in ("max_batch_size", "max_completions", "retry_after_s", "max_connections"):
            if getattr(self, name) < 1:
                raise ServeConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("max_queue", "max_body_bytes", "threads"):
            if getattr(self, name) < 0:
                raise ServeConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("request_timeout_s", "graceful_shutdown_s", "read_timeout_s"):
            if not getattr(self, name) > 0:
                raise ServeConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.port <= 65535:
            raise ServeConfigError(f"port must be in 0..65535, got {self.port}")
