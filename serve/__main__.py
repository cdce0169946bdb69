"""Serve a checkpoint over HTTP.

    python -m serve                                   # the most-trained train.py checkpoint under out/, on 127.0.0.1:8000
    python -m serve --checkpoint out/demo/train --port 8080 --max-batch-size 32
    GPT2_SERVE_API_KEY=secret python -m serve         # every generation request must send the key
"""
from __future__ import annotations

import errno
import ipaddress
import logging
import resource
import socket

import uvicorn

from runtime.cli import entry_point, parse_config
from serve.app import create_app
from serve.config import API_KEY_ENV, ServeConfig, ServeConfigError
from serve.slow_clients import connection_protocol
from storage.hub import shown

# Descriptors the server holds besides client connections: 7 measured at rest (model files are read and
# closed; the listening socket, the event loop's pipes, stdio), with room for the tokenizer, logs and torch.
FILES_BESIDES_CONNECTIONS = 32
# The listen backlog, which is also how many connections asyncio accepts in one event-loop tick, before any
# of them can be refused (uvicorn's default, 2048, let a burst exhaust the descriptors the cap protects).
ACCEPT_BACKLOG = 64
# Accepted sockets the cap has not closed yet: one tick accepts, the next creates the transports, the next
# refuses, the next closes (measured: up to ~190 at once while 400 connections arrived together).
ACCEPTED_NOT_YET_REFUSED = 4 * ACCEPT_BACKLOG

def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_port(host: str, port: int) -> None:
    """Bind the address the server will listen on, and let it go: a port in use (or a host that is not this
    machine's) is refused before the model loads, not after.  The socket is made as uvicorn makes its own (the
    family by the host's form, SO_REUSEADDR), so the test passes exactly when uvicorn's bind would."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ServeConfigError(f"port {port} on {host} is in use; pass --port with a free one (--port 0 picks "
                                   f"any), or stop the server holding it") from e
        raise ServeConfigError(f"cannot listen on {shown(host)} port {port}: {e.strerror or e}; check --host and "
                               f"--port") from e
    except (UnicodeError, ValueError, TypeError) as e:  # what socket raises for a name it cannot even encode
        raise ServeConfigError(f"--host {shown(host)} is not a host name or address") from e


@entry_point
def main(argv=None) -> None:
    config = parse_config(ServeConfig, __doc__, argv, epilog=f"Set {API_KEY_ENV} to require an API key.",
                          prog="python -m serve")
    check_port(config.host, config.port)
    app = create_app(config)
    if not is_loopback(config.host):
        logging.getLogger("serve").warning("binding to %s: the server is reachable from other machines%s", config.host,
                                           "" if app.state.server.api_keys else f"; set {API_KEY_ENV} to require a key")
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
