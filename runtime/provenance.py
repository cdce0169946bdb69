"""What produced a file: the tool, its source, the git commit and the date, recorded in every artifact."""
from __future__ import annotations

import datetime
import subprocess
from pathlib import Path


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(tool: str, source: str | Path | None = None) -> dict:
    return {"tool": tool, "source": str(source) if source else None, "git_commit": git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
