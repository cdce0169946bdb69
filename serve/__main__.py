"""Serve a checkpoint over HTTP.

    python -m serve                                   # the newest artifact under out/, on 127.0.0.1:8000
    python -m serve --checkpoint out/demo/train --port 8080 --max-batch-size 32
    GPT2_SERVE_API_KEY=secret python -m serve         # every generation request must send the key
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import resource
import sys

import uvicorn

from data.tokenizer import TokenizerError
from model.artifact import ArtifactError
from runtime.cli import add_dataclass_args, dataclass_from_args
from runtime.errors import UserError
from serve.app import create_app
from serve.config import API_KEY_ENV, ServeConfig
from serve.slow_clients import connection_protocol

# Descriptors the server holds besides client connections: 7 measured at rest (model files are read and
# closed; the listening socket, the event loop's pipes, stdio), with room for the tokenizer, logs and torch.
FILES_BESIDES_CONNECTIONS = 32
# The listen backlog, which is also how many connections asyncio accepts in one event-loop tick, before any
# of them can be refused (uvicorn's default, 2048, let a burst exhaust the descriptors the cap protects).
ACCEPT_BACKLOG = 64
# Accepted sockets the cap has not closed yet: one tick accepts, the next creates the transports, the next
# refuses, the next closes (measured: up to ~190 at once while 400 connections arrived together).
ACCEPTED_NOT_YET_REFUSED = 4 * ACCEPT_BACKLOG

HELP = {
    "checkpoint": "artifact folder (float, pruned or int8); default: the newest under out/",
    "served_model_name": "the model id /v1/models lists and /v1/completions expects (default: the artifact "
                         "folder's name)",
    "host": "interface to bind; anything but loopback exposes the server to the network",
    "device": "auto, cpu, cuda or cuda:N",
    "threads": "torch intra-op threads (0: torch's default); 1 suits small models on a busy CPU",
    "max_batch_size": "sequences decoded together in one forward pass",
    "max_queue": "requests that may wait for a batch slot before new ones get 503",
    "request_timeout_s": "time limit per request, queueing included",
    "max_body_bytes": "larger request bodies get 413",
    "read_timeout_s": "seconds a client has to send a request's headers, and again its body; slower ones get 408",
    "max_connections": "open connections at once; one more is answered 503 (keep it below the open-file limit)",
    "retry_after_s": "the Retry-After header of a 503",
    "max_completions": "the most completions (prompts x n) one /v1/completions request may ask for",
    "graceful_shutdown_s": "how long Ctrl-C / SIGTERM waits for in-flight requests",
}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=f"Set {API_KEY_ENV} to require an API key.")
    add_dataclass_args(parser, ServeConfig, HELP)
    args = parser.parse_args(argv)
    try:
        config = dataclass_from_args(ServeConfig, args)
        app = create_app(config)
    except UserError as e:
        sys.exit(f"error: {e}")
    if not is_loopback(config.host):
        logging.getLogger("serve").warning("binding to %s: the server is reachable from other machines%s", config.host,
                                           "" if app.state.server.api_key else f"; set {API_KEY_ENV} to require a key")
    open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if config.max_connections + ACCEPTED_NOT_YET_REFUSED + FILES_BESIDES_CONNECTIONS > open_files:
        logging.getLogger("serve").warning("--max-connections %d is close to the open-file limit of %d (ulimit -n): "
                                           "a flood of connections will fail with 'Too many open files' before the "
                                           "cap answers 503", config.max_connections, open_files)
    protocol = connection_protocol(config.max_connections, config.read_timeout_s, config.retry_after_s,
                                   app.state.server.metrics)
    # ws="none": no route takes a websocket, and an upgrade would hand the socket to a protocol without the limits.
    uvicorn.run(app, host=config.host, port=config.port, access_log=False, http=protocol, ws="none",
                backlog=ACCEPT_BACKLOG, timeout_graceful_shutdown=config.graceful_shutdown_s)


if __name__ == "__main__":
    main()
