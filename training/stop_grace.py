"""How long a stop signal leaves before the SIGKILL that follows it, and how that was learnt.

torchrun (torch/distributed/elastic/agent/server/api.py, `SimpleElasticAgent.run`): on SIGINT or SIGTERM its agent
calls `_shutdown(sig, timeout=shutdown_timeout)`, which passes the signal to every worker and, `timeout` seconds after
sending it (multiprocessing/api.py, `SubprocessContext._close`), SIGKILLs the ones still alive.  `shutdown_timeout` is
its `--shutdown-timeout` flag (also read from PET_SHUTDOWN_TIMEOUT), else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else
TORCHRUN_DEFAULT_S (launcher/api.py, `LaunchConfig.__post_init__`).  A worker inherits the agent's environment but not its flags, so the
flag is read from the agent's command line (/proc/<parent>/cmdline, Linux).  Without torchrun, SCHEDULER_DEFAULT_S is what the usual
schedulers give between SIGTERM and SIGKILL by default (Slurm's KillWait, Kubernetes' terminationGracePeriodSeconds);
--stop-grace-s names another.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TORCHRUN_DEFAULT_S = 30.0  # launcher/api.py: int(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"))
SCHEDULER_DEFAULT_S = 30.0  # Slurm KillWait, Kubernetes terminationGracePeriodSeconds
FLAGS = ("--shutdown-timeout", "--shutdown_timeout")


@dataclass(frozen=True)
class Grace:
    seconds: float
    source: str  # said in the stop's announcement: "torchrun --shutdown-timeout 60"


def flag_value(argv: list[str]) -> str | None:
    """The value of torchrun's --shutdown-timeout in `argv` (`--shutdown-timeout 60` or `=60`), the last one given
    (train.py has no such flag, so one after the script's name is not taken for torchrun's: it never gets there)."""
    value = None
    for i, arg in enumerate(argv):
        for name in FLAGS:
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg[len(name) + 1:]
    return value


def launcher_argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:  # not Linux, or the launcher has gone
        return []


def torchrun_grace(env: dict[str, str], launcher: list[str]) -> Grace:
    """torchrun's shutdown timeout as its agent resolves it, from the agent's command line and environment."""
    for value, source in ((flag_value(launcher), "torchrun --shutdown-timeout"),
                          (env.get("PET_SHUTDOWN_TIMEOUT"), "PET_SHUTDOWN_TIMEOUT"),
                          (env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"), "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")):
        if value is not None:
            try:
                seconds = int(value)  # as torchrun reads it
            except ValueError:  # torchrun itself refuses it at launch; nothing to learn from it here
                continue
            # torchrun checks only its flag for a negative timeout; from its environment one means SIGKILL at once.
            return Grace(float(max(0, seconds)), f"{source} {value}")
    return Grace(TORCHRUN_DEFAULT_S, "torchrun's default shutdown timeout")


def stop_grace(given_s: float | None, under_torchrun: bool) -> Grace:
    """The grace this process has after a stop signal: --stop-grace-s if given, else the launcher's."""
    if given_s is not None:
        return Grace(given_s, "--stop-grace-s")
    if under_torchrun:
        return torchrun_grace(dict(os.environ), launcher_argv(os.getppid()))
    return Grace(SCHEDULER_DEFAULT_S, "the usual schedulers' default")
