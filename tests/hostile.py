"""The one property every input surface is held to (tests/test_hostile_*.py): given any input, a command either
works or stops with one `error:` line that names the problem -- never a traceback -- and the files it reads are
byte-identical afterwards.

Each surface's suite draws bad inputs with Hypothesis and passes every attempt through `attempt` (in-process: the
tool's `main`, or the function it calls) or `run_command` (a subprocess: signals, exit codes).  Two profiles
(tests/conftest.py): `ci`, fixed-seed and bounded, in `make test`; `fuzz`, `make fuzz`'s long run, which sets
HOSTILE_REPORT so every attempt is counted per surface and outcome (tests/fuzz.py writes the table).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from hypothesis import settings

from runtime.errors import UserError

REPORT_ENV = "HOSTILE_REPORT"
PROFILE_ENV = "HYPOTHESIS_PROFILE"
FUZZ_FACTOR = 40  # `make fuzz` tries this many times the examples `make test` does


def examples(ci: int) -> settings:
    """A property's example budget: `ci` in `make test`, FUZZ_FACTOR times that under `make fuzz`."""
    fuzzing = os.environ.get(PROFILE_ENV) == "fuzz"
    return settings(max_examples=ci * FUZZ_FACTOR if fuzzing else ci)


def record(surface: str, outcome: str, detail: str = "") -> None:
    """Count one attempt (only under `make fuzz`): one JSON line, appended in one write so workers never mix."""
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    line = json.dumps({"surface": surface, "outcome": outcome, "detail": detail[-600:]}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def check_error_line(message: str, surface: str) -> None:
    """A refusal's message: one non-empty line, no traceback."""
    if not message or "\n" in message.strip() or "Traceback" in message:
        record(surface, "bad message", message)
        raise AssertionError(f"{surface}: a refusal must be one line naming the problem, got {message!r}")


def attempt(surface: str, action: Callable[[], object]) -> str:
    """Run `action` (a tool's `main(argv)` or the function behind it): "worked" or "refused" (a UserError, or the
    SystemExit carrying `main`'s `error:` line).  Anything else -- a traceback a user would see -- propagates, so
    the property fails with it."""
    try:
        action()
    except UserError as e:
        check_error_line(str(e), surface)
        outcome = "refused"
    except SystemExit as e:
        if e.code in (0, None):
            outcome = "worked"
        else:
            message = e.code if isinstance(e.code, str) else ""
            check_error_line(message, surface)
            if not message.startswith("error: "):
                record(surface, "bad message", message)
                raise AssertionError(f"{surface}: exit message must start with 'error: ', got {message!r}")
            outcome = "refused"
    except BaseException as e:
        record(surface, "traceback", f"{type(e).__name__}: {e}")
        raise
    else:
        outcome = "worked"
    record(surface, outcome)
    return outcome


def run_command(surface: str, argv: list[str], *, cwd: str | Path | None = None, env: dict | None = None,
                timeout: float = 120, allowed_codes: tuple[int, ...] = ()) -> subprocess.CompletedProcess:
    """Run a command in a subprocess (`python` is this interpreter); it must exit 0 (or with one of
    `allowed_codes`, e.g. 130 after Ctrl-C), or non-zero with its last stderr line `error: ...`.  No traceback
    on stderr either way."""
    argv = [sys.executable if a == "python" else a for a in argv]
    result = subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                            timeout=timeout)
    check_finished(surface, result, allowed_codes)
    return result


def check_finished(surface: str, result: subprocess.CompletedProcess, allowed_codes: tuple[int, ...] = ()) -> str:
    """The property for a finished subprocess (see `run_command`); returns its outcome."""
    if "Traceback" in result.stderr:
        record(surface, "traceback", f"exit {result.returncode}: {result.stderr[-500:]}")
        raise AssertionError(f"{surface}: traceback on stderr (exit {result.returncode}):\n{result.stderr[-3000:]}")
    if result.returncode == 0:
        outcome = "worked"
    elif result.returncode in allowed_codes:
        outcome = f"exit {result.returncode}"
    else:
        last = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
        if not last.startswith("error: "):
            record(surface, "bad message", f"exit {result.returncode}: {result.stderr[-500:]}")
            raise AssertionError(f"{surface}: exit {result.returncode} without an 'error:' line:\n"
                                 f"{result.stderr[-3000:]}")
        outcome = "refused"
    record(surface, outcome)
    return outcome


def file_digests(folder: str | Path) -> dict[str, str]:
    """Every file under `folder` (symlinks as their targets' names, not followed) with its content's digest."""
    folder, digests = Path(folder), {}
    if folder.is_file():
        return {folder.name: hashlib.blake2b(folder.read_bytes(), digest_size=16).hexdigest()}
    for path in sorted(folder.rglob("*")):
        relative = str(path.relative_to(folder))
        if path.is_symlink():
            digests[relative] = "-> " + os.readlink(path)
        elif path.is_file():
            digests[relative] = hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
    return digests


@contextmanager
def unchanged(surface: str, *sources: str | Path) -> Iterator[None]:
    """The sources' files are byte-identical after the block (and none vanished or appeared)."""
    before = {str(s): file_digests(s) for s in sources}
    yield
    for source, digests in before.items():
        after = file_digests(source) if Path(source).exists() else {}
        if after != digests:
            changed = sorted(set(digests.items()) ^ set(after.items()))
            record(surface, "source changed", str(changed[:3]))
            raise AssertionError(f"{surface}: the source {source} changed: {changed[:5]}")
