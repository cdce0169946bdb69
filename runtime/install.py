"""make setup's installer: the requirements into a virtual environment with uv, pinned below, which installs them in a
fraction of pip's time (unpacking in parallel, linking from its cache; bench/by_hand.md, "make setup with uv").  uv
reads no pip configuration, so the package sources pip is configured with on this host (`pip config list`: its
files and PIP_* variables) are handed to uv as flags.  Where uv cannot be installed or fails, pip installs the same
requirements, after one line saying why.  Standard library only: it runs before anything is installed.

    python3 -m runtime.install .venv/bin/python -r requirements.txt -r requirements-test.txt
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from runtime.cli import entry_point
from runtime.errors import UserError

UV = "uv==0.13.9"
# pip's settings that choose where packages come from and which versions are allowed, and uv's flag for each.  pip
# weighs all its indexes alike; uv does so only with unsafe-best-match (its default takes a package from the first
# index that has it, which here may lack the pinned version).
LIST_FLAGS = {"find-links": "--find-links", "extra-index-url": "--extra-index-url", "constraint": "--constraints",
              "trusted-host": "--allow-insecure-host"}
ONE_FLAGS = {"index-url": "--index-url"}
SWITCHES = {"no-index": "--no-index", "pre": "--prerelease=allow"}
ALWAYS = ["--index-strategy", "unsafe-best-match"]
# pip's scopes, weakest first: the files' global and install sections, then the environment (PIP_*).
SCOPES = ("global", "install", ":env:")
CONFIG_LINE = re.compile(r"^(?P<scope>[^.=]+)\.(?P<key>[a-z0-9-]+)=(?P<value>.*)$")
# pip prints each value as Python's repr of a string; nothing else is evaluated (a nested literal could recurse deep).
STRING_LITERAL = re.compile(r"""^(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")$""")


class ConfigError(UserError):
    """pip's configuration, as `pip config list` prints it, could not be read."""


def pip_settings(listing: str) -> dict[str, str]:
    """`pip config list` output as key -> value, the strongest scope winning (and within a scope the later line, as
    pip's later configuration files override its earlier ones)."""
    found: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        if not line.strip():
            continue
        match = CONFIG_LINE.match(line)
        if not match:
            raise ConfigError(f"`pip config list` printed a line this installer cannot read: {line!r}")
        scope, key = match["scope"], match["key"]
        if not STRING_LITERAL.match(match["value"]):
            raise ConfigError(f"`pip config list` printed a value that is not a quoted string: {line!r}")
        try:
            value = ast.literal_eval(match["value"])
        except (ValueError, SyntaxError):  # an escape Python does not know (\N{...} of no such name)
            raise ConfigError(f"`pip config list` printed a value this installer cannot read: {line!r}") from None
        if scope in SCOPES and (key not in found or SCOPES.index(scope) >= found[key][0]):
            found[key] = (SCOPES.index(scope), value)
    return {key: value for key, (_, value) in found.items()}


def uv_flags(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's flags and environment for pip's settings (the certificate is an environment variable to uv)."""
    flags = list(ALWAYS)
    for key, flag in ONE_FLAGS.items():
        if key in settings:
            flags += [flag, settings[key]]
    for key, flag in LIST_FLAGS.items():
        for value in settings.get(key, "").split():
            flags += [flag, value]
    for key, flag in SWITCHES.items():
        if settings.get(key, "").lower() in ("1", "true", "yes", "on"):
            flags.append(flag)
    env = {"SSL_CERT_FILE": settings["cert"]} if "cert" in settings else {}
    return flags, env


def run(command: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run(command, env={**os.environ, **(env or {})}, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise RuntimeError(f"`{' '.join(command[:4])} ...` failed: {lines[-1]}")


def with_uv(python: Path, requirements: list[str]) -> None:
    run([str(python), "-m", "pip", "install", "--quiet", UV])
    listing = subprocess.run([str(python), "-m", "pip", "config", "list"], capture_output=True, text=True, check=True)
    flags, env = uv_flags(pip_settings(listing.stdout))
    uv = [str(python.parent / "uv"), "pip", "install", "--quiet", "--python", str(python)]
    run([*uv, *flags, "setuptools>=68", *requirements], env)
    run([*uv, *flags, "--no-deps", "--no-build-isolation", "-e", "."], env)


def with_pip(python: Path, requirements: list[str]) -> None:
    pip = [str(python), "-m", "pip", "install", "--quiet", "--no-compile"]
    run([*pip, "setuptools>=68", *requirements])
    run([*pip, "--no-deps", "--no-build-isolation", "-e", "."])


class InstallError(UserError):
    """Neither uv nor pip could install the requirements."""


@entry_point
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("python", type=Path, help="the virtual environment's python")
    parser.add_argument("-r", dest="requirements", action="append", default=[], help="a requirements file")
    args = parser.parse_args(argv)
    requirements = [word for path in args.requirements for word in ("-r", path)]
    try:
        with_uv(args.python, requirements)
    except (RuntimeError, ConfigError, OSError, subprocess.CalledProcessError) as error:
        print(f"make setup: uv could not install the requirements ({error}); installing them with pip instead",
              file=sys.stderr)
        try:
            with_pip(args.python, requirements)
        except RuntimeError as error:
            raise InstallError(f"{error}; the requirements files name what make setup installs") from None


if __name__ == "__main__":
    main()
