"""What the routes share: the engine, the settings and what was loaded (kept on `app.state.server`)."""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

import torch
from fastapi import Request

from data.tokenizer import encode, get_tokenizer
from decode.request_sampling import sampling_params
from decode.sampling import SamplingError, SamplingParams
from serve.config import ServeConfig
from serve.engine import Engine
from serve.errors import APIError
from serve.metrics import ServerMetrics


@dataclass
class ServerState:
    config: ServeConfig
    engine: Engine
    metrics: ServerMetrics
    checkpoint: Path
    artifact_kind: str
    model_id: str  # the name /v1/models lists and /v1/completions expects
    created: int  # when the artifact was written (Unix time), for /v1/models
    device: torch.device
    api_keys: tuple[str, ...]  # any one of them admits a request; none, every request is admitted

    @property
    def block_size(self) -> int:
        return self.engine.config.block_size

    @property
    def vocab_size(self) -> int:
        return self.engine.config.vocab_size

    def encode_within_context(self, prompt: str, max_new: int, prompt_field: str, max_new_field: str) -> list[int]:
        """The prompt's tokens, or a 422 that gives the numbers when prompt + new tokens overflow the context."""
        ids = encode(prompt)
        self.check_context(ids, max_new, prompt_field, max_new_field)
        return ids

    def check_context(self, ids: list[int], max_new: int, prompt_field: str, max_new_field: str) -> None:
        if len(ids) + max_new > self.block_size:
            param = prompt_field if len(ids) >= self.block_size else max_new_field
            raise APIError(422, f"{prompt_field} is {len(ids)} token(s) and {max_new_field} is {max_new}: "
                                f"{len(ids) + max_new} exceeds the model's context of {self.block_size} tokens; "
                                f"shorten the prompt or lower {max_new_field}", param=param, code="context_length_exceeded")

    def sampling(self, fields: dict) -> SamplingParams:
        """The request's SamplingParams (decode/request_sampling.py, named as its SAMPLING_FIELDS), or a 422 naming
        the knob this server cannot honour."""
        try:
            # The model may have more rows than the tokenizer has tokens (padded) or fewer (a small test model).
            return sampling_params(fields, min(self.vocab_size, get_tokenizer().n_vocab),
                                   speculative=self.config.draft is not None)
        except SamplingError as e:
            raise APIError(422, str(e), param=e.field) from e

    def check_top_k(self, top_k: int | None) -> None:
        if top_k is not None and top_k > self.vocab_size:
            raise APIError(422, f"top_k: {top_k} exceeds the vocabulary of {self.vocab_size} tokens", param="top_k")


def server_state(request: Request) -> ServerState:
    return request.app.state.server


def require_api_key(request: Request) -> None:
    """When API keys are configured, accept `Authorization: Bearer KEY` (what the openai client sends) or
    `X-API-Key` with any one of them, and note which one: its requests' prefix-cache salt derives from it."""
    keys = server_state(request).api_keys
    if not keys:
        return
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    # The scheme is case-insensitive (RFC 9110): "bearer KEY" is as good as "Bearer KEY".
    given = (credentials.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "")).encode()
    # Every key compared, each in constant time: the time taken says nothing of which key (or how much of one) matched.
    matches = [hmac.compare_digest(given, key.encode()) for key in keys]
    if not any(matches):
        raise APIError(401, "missing or wrong API key: send `Authorization: Bearer <key>` or `X-API-Key: <key>`",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    request.state.api_key = keys[matches.index(True)]


def cache_salt(request: Request, field: str | None) -> bytes:
    """The request's prefix-cache salt (decode/prefix_cache.py): a digest of the API key it presented, when the
    server has keys, and of its own `cache_salt` field, when it sends one.  Requests share cached blocks only when
    both agree, so clients with different keys never reuse (or time, or count) each other's prompts, and clients of
    one key can keep apart by sending salts of their own."""
    key = getattr(request.state, "api_key", None)
    if key is None and field is None:
        return b""
    digest = hashlib.sha256(b"gpt2-serve-cache-salt")
    for part in (b"" if key is None else key.encode(), b"" if field is None else field.encode()):
        digest.update(len(part).to_bytes(8, "little") + part)
    # Whether a key or a field was present at all is part of the salt too.
    digest.update(bytes([key is not None, field is not None]))
    return digest.digest()
