"""The FastAPI application: load the artifact, start the engine, mount the routes.

    uvicorn --factory serve.app:create_app        # checkpoint from $GPT2_SERVE_CHECKPOINT, else the most-trained under out/
    python -m serve --checkpoint out/demo/train    # the same, with every setting as a flag
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import torch
from fastapi import Depends, FastAPI, Request
from fastapi.responses import PlainTextResponse

from data.tokenizer import get_tokenizer
from decode.prefix_cache import default_budget_bytes
from model.packed_linear import pack_for_inference
from runtime.device import choose_device
from serve import routes_generate, routes_openai, routes_tokens
from serve.body_limit import BodySizeLimit
from serve.config import CHECKPOINT_ENV, ServeConfig, api_keys_from_environment
from serve.docs import install_docs
from serve.playground_page import install_playground
from serve.rehearsal import rehearse
from serve.engine import Engine
from serve.errors import install_error_handlers
from serve.metrics import ServerMetrics
from serve.request_log import RequestLog
from serve.schemas import CompletionRequest, DetokenizeRequest, GenerateRequest, TokenizeRequest
from serve.slow_clients import BodyReadDeadline
from serve.state import ServerState, require_api_key, server_state
from storage.artifact import load_model
from storage.hub import resolve_checkpoint
from storage.meta import CONFIG_FILE
from storage.run_folder import pick_checkpoint

log = logging.getLogger("serve")
T = TypeVar("T")


def create_app(config: ServeConfig | None = None) -> FastAPI:
    """Load the model now (a bad checkpoint fails before the server binds); the engine starts with the app."""
    config = config or ServeConfig(checkpoint=os.environ.get(CHECKPOINT_ENV))
    api_keys = api_keys_from_environment()
    if not logging.getLogger().handlers:
        # Uvicorn configures only its own loggers; the per-request lines need a handler too.
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    folder, why = pick_checkpoint(config.checkpoint)
    # The draft's name too, before either model loads.
    draft_folder = None if config.draft is None else resolve_checkpoint(config.draft, "--draft")
    log.info("model: %s (%s)", folder, why)
    device = choose_device(config.device)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    metrics = ServerMetrics()

    def build() -> tuple[Engine, dict]:
        model, meta = load_model(folder, device)
        log.info("%s", pack_for_inference(model))
        draft = None
        if draft_folder is not None:
            draft, draft_meta = load_model(draft_folder, device)
            log.info("draft: %s model from %s, %d tokens per step; %s", draft_meta.kind, config.draft,
                     config.draft_tokens, pack_for_inference(draft))
        prefix_cache_bytes = (default_budget_bytes(model.config) if config.prefix_cache_mb is None
                              else config.prefix_cache_mb << 20)
        log.info("prefix cache: %s", f"{prefix_cache_bytes / 2**20:.1f} MiB (--prefix-cache-mb)" if prefix_cache_bytes else "off")
        engine = Engine(model, device, config.max_batch_size, config.max_queue, config.request_timeout_s, metrics,
                        config.decode, draft, config.draft_tokens, prefix_cache_bytes,
                        config.stream_interval_ms / 1000, config.async_steps)
        return engine, meta

    engine, meta = off_the_main_thread(build)
    get_tokenizer()  # loaded now, so a missing tokenizer fails at startup rather than on the first request
    log.info("loaded %s model from %s on %s", meta.kind, folder, device)
    state = ServerState(config=config, engine=engine, metrics=metrics, checkpoint=folder,
                        artifact_kind=meta.kind, model_id=config.served_model_name or folder.resolve().name,
                        created=int((folder / CONFIG_FILE).stat().st_mtime), device=device,
                        api_keys=api_keys)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        # Warmed up on the engine's thread, before the server takes requests (uvicorn binds after this).
        await asyncio.to_thread(engine.start, config.warm_up == "all-rows")
        await rehearse(app, state)
        yield
        # Uvicorn has let in-flight requests finish by now; drain whatever is left off the event loop.
        await asyncio.to_thread(engine.stop)

    # The documentation pages come from serve/docs.py, with their files: FastAPI's load them from a CDN.
    app = FastAPI(title="GPT-2 generation server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state
    app.include_router(routes_generate.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_tokens.router)
    app.add_api_route("/health", health, methods=["GET"])
    # With keys set, /metrics needs one too: its prefix-cache counters would tell one client what another sent.
    app.add_api_route("/metrics", prometheus_metrics, methods=["GET"], response_class=PlainTextResponse,
                      dependencies=[Depends(require_api_key)])
    install_error_handlers(app, {"/generate": GenerateRequest, "/v1/completions": CompletionRequest,
                                 "/tokenize": TokenizeRequest, "/detokenize": DetokenizeRequest},
                           config.max_body_bytes)
    page_paths = install_playground(app)
    docs_paths = install_docs(app)
    known_paths = set(app.openapi()["paths"]) | docs_paths | page_paths | {app.openapi_url}
    app.add_middleware(BodySizeLimit, max_body_bytes=config.max_body_bytes)
    app.add_middleware(BodyReadDeadline, timeout_s=config.read_timeout_s)
    # Added last, so outermost: it logs and counts the 413s too.
    app.add_middleware(RequestLog, metrics=metrics, known_paths=known_paths)
    return app


def off_the_main_thread(fn: Callable[[], T]) -> T:
    """fn's result (or exception), computed on a thread that ends when it returns.

    The server's torch work then runs on the engine's thread alone.  OpenMP gives every thread that runs
    parallel work a pool of workers of its own, and a pool left on the main thread by loading the model
    competes with the engine's for the same cores (on a 2-core CPU it slowed decoding); a pool that
    ends with its thread costs nothing."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="serve-load") as pool:
        return pool.submit(fn).result()


async def health(request: Request) -> dict:
    state = server_state(request)
    # /health needs no key: with one set, the folder's name only, not where it lives.
    checkpoint = state.checkpoint.name if state.api_keys else str(state.checkpoint)
    return {"status": "ok", "model_loaded": True, "artifact": state.artifact_kind, "checkpoint": checkpoint,
            "model": state.model_id, "device": str(state.device), "context": state.block_size,
            "vocab_size": state.vocab_size, "max_batch_size": state.config.max_batch_size,
            "batch_size": state.engine.batch_size, "queue_depth": state.engine.queue_depth,
            "api_key_required": bool(state.api_keys)}


async def prometheus_metrics(request: Request) -> PlainTextResponse:
    state = server_state(request)
    state.metrics.queue_depth.set(state.engine.queue_depth)
    state.metrics.batch_size.set(state.engine.batch_size)
    return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")
