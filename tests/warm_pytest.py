"""A warm pytest for `make mutate`: a server that imports the suite's libraries (torch, pydantic, hypothesis, ...)
once and runs each pytest command in a forked child, and the client Cosmic Ray runs as its test command.

On a busy 2-core host a fresh pytest process spends some 10-15 s importing before its first test; a mutant's tests
often take well under that.  The child drops every module of the project from its copy of the server's memory
before pytest starts, so the mutated file (and everything importing it) is read from disk afresh, and writes no
bytecode: a mutant and the original can share a size and a second of modification time, and a .pyc written for one
would then be taken for the other.

    python -m tests.warm_pytest serve SOCKET            # prints "ready" once the libraries are in
    python -m tests.warm_pytest run SOCKET TIMEOUT -- ARGS...   # pytest ARGS in a fork; exits with its status
    python -m tests.warm_pytest run SOCKET TIMEOUT -- ARGS... --then ARGS...   # the second only if the first passed
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import sys
import time

# What the suite's test files import that is not the project: imported once, shared by every fork.
LIBRARIES = ("numpy", "torch", "pytest", "hypothesis", "pydantic", "fastapi", "starlette.testclient", "httpx",
             "safetensors.torch", "tiktoken", "xxhash", "zstandard", "pyarrow.parquet", "matplotlib.pyplot",
             "schemathesis", "uvicorn")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMED_OUT = 124  # the exit status `timeout` gives, for a run cut off at its limit
# Between the stages of a run's pytest arguments: a stage runs only when the one before it passed, so a mutant the
# first (fast) tests kill never costs the collection of the slower files.
THEN = "--then"


def preload() -> None:
    import matplotlib
    matplotlib.use("Agg")
    for name in LIBRARIES:
        try:
            importlib.import_module(name)
        except ImportError:  # a library some tests skip without: those tests import nothing here
            continue


def run_child(args: list[str]) -> None:
    """In the forked child: forget the project's modules, run pytest, and leave with its status."""
    sys.dont_write_bytecode = True
    for name, module in list(sys.modules.items()):
        # __main__ (this file) stays: a test that starts processes with multiprocessing's spawn looks it up
        if name != "__main__" and (getattr(module, "__file__", None) or "").startswith(ROOT + os.sep):
            del sys.modules[name]
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    import pytest
    try:
        status = int(pytest.main(args))
    except BaseException:  # whatever it was, the mutant broke the run
        status = 3
    os._exit(status)


def run(args: list[str], timeout: float) -> int:
    child = os.fork()
    if child == 0:
        os.setsid()  # its own group: a timeout ends whatever it started too
        run_child(args)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 2
        time.sleep(0.05)
    os.killpg(child, signal.SIGKILL)
    os.waitpid(child, 0)
    return TIMED_OUT


def serve(path: str) -> None:
    os.chdir(ROOT)
    preload()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    print("ready", flush=True)
    while True:
        connection, _ = server.accept()
        with connection, connection.makefile("rw") as stream:
            request = json.loads(stream.readline())
            status = run(request["args"], request["timeout"])
            try:
                stream.write(f"{status}\n")
                stream.flush()
            except OSError:  # the client was stopped (Cosmic Ray's own timeout): the next run goes on
                continue


def client(path: str, timeout: float, args: list[str]) -> int:
    """pytest `args` in the server's fork; args holding THEN run in stages, each only when the one before passed,
    within `timeout` in all."""
    deadline = time.monotonic() + timeout
    stages = [[]]
    for arg in args:
        stages.append([]) if arg == THEN else stages[-1].append(arg)
    for stage in stages:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(path)
            with connection.makefile("rw") as stream:
                stream.write(json.dumps({"args": stage, "timeout": max(1.0, deadline - time.monotonic())}) + "\n")
                stream.flush()
                status = int(stream.readline())
        if status != 0:
            break
    if status == TIMED_OUT:
        print(f"timed out after {timeout:g} s")  # Cosmic Ray keeps this output: the mutant is counted as timed out
    return status


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit(client(sys.argv[2], float(sys.argv[3]), sys.argv[sys.argv.index("--") + 1:]))
