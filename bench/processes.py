"""The one launcher of every process bench/ starts: tools run to completion (train.py, torchrun, prune/ and quantize/,
pytest, git, make, lm-eval) and processes that run beside the measurement (a training run being killed, readers,
busy loops, the peers' decoding sides).

A child starts in the project root (or where it is told: a command that takes paths from the user starts where the
user is) with the project first on PYTHONPATH, so `python train.py` and `python -m bench...` find this checkout's
code; `threads` sets its OMP_NUM_THREADS.  `start` returns it running;
`run_command` waits for it, in a session of its own, so that a timeout or Ctrl-C ends its children too (torchrun's
ranks), never leaving them behind.  Output is captured unless told otherwise (STDOUT merges stderr into stdout;
INHERIT passes the terminal through).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL
INHERIT = None  # the parent's own stdin, stdout or stderr


@dataclass
class Finished:
    returncode: int | None  # None: stopped at the time limit
    stdout: str  # with stderr in it when started with stderr=STDOUT
    stderr: str
    seconds: float  # from its start

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class Process(subprocess.Popen):
    """A child started by `start`: a Popen that knows when it started and whether it leads a session."""

    def __init__(self, command: list[str], own_session: bool, **popen):
        self.started = time.perf_counter()
        self.own_session = own_session
        super().__init__(command, start_new_session=own_session, **popen)

    def kill_all(self) -> None:
        """SIGKILL to it, and to every process of its session when it leads one."""
        try:
            if self.own_session:
                os.killpg(self.pid, signal.SIGKILL)
            else:
                self.kill()
        except ProcessLookupError:  # it and its session have ended already
            pass

    def finish(self, timeout_s: float | None = None) -> Finished:
        """Wait for it to exit and take its output; past `timeout_s` it is killed (returncode None).  Interrupted
        (Ctrl-C), it is killed before the interruption goes on."""
        try:
            stdout, stderr = self.communicate(timeout=timeout_s)
            returncode = self.returncode
        except subprocess.TimeoutExpired:
            self.kill_all()
            stdout, stderr = self.communicate()
            returncode = None
        except BaseException:
            self.kill_all()
            raise
        return Finished(returncode, stdout or "", stderr or "", time.perf_counter() - self.started)

    def stop(self, grace_s: float = 0) -> int:
        """End it: `grace_s` seconds to exit by itself, then SIGKILL; its exit code."""
        try:
            return self.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill_all()
            return self.wait()


def child_env(threads: int | None, env: Mapping[str, str] | None, base_env: Mapping[str, str] | None) -> dict:
    base = dict(base_env) if base_env is not None else \
        {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    return {**base, **(env or {}), **({"OMP_NUM_THREADS": str(threads)} if threads is not None else {})}


def start(command: list[str], *, cwd: Path | None = ROOT, threads: int | None = None, env: Mapping[str, str] | None = None,
          base_env: Mapping[str, str] | None = None, stdin=INHERIT, stdout=PIPE, stderr=PIPE, text: bool = True,
          own_session: bool = False) -> Process:
    """Start `command` and return it running.  `cwd`: where it starts (None: this process's working directory);
    `env`: variables set for it on top of `base_env` (default: this process's environment with the project first
    on PYTHONPATH; a tool of another checkout or environment gets its own); `own_session`: a session of its own,
    which `finish` and `stop` end as a whole."""
    return Process(command, own_session, cwd=cwd, env=child_env(threads, env, base_env), stdin=stdin, stdout=stdout,
                   stderr=stderr, text=text)


def run_command(command: list[str], *, timeout_s: float | None = None, **launch) -> Finished:
    """Run `command` to completion (`start`'s settings), in a session of its own: at `timeout_s`, or when this
    process is interrupted, it is killed with everything it started."""
    return start(command, own_session=True, **launch).finish(timeout_s)
