"""Hostile .contents or journal: a folder whose `.contents` (given to quantize --overwrite) or save journal (given
to sample.py, a reader) names a place outside it (`..`, absolute, through a symlink); a failure is a file outside
moved or deleted, or anything but one `error:` line naming the entry.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from bench.drills.drill import Drill, DrillSettings, last_error_line, small_artifact
from bench.processes import run_command
from storage.folder import STAGING_DIR


def run(s: DrillSettings, work: Path) -> Drill:
    source = small_artifact(work / "serve-model")
    work = work.resolve()  # the absolute entry must be absolute, and the symlink must point out of the folder
    failures, trials, notes = 0, 0, []
    for which, entry in enumerate(("../victim", str(work / "hostile" / "victim"), "link/precious.txt")):
        for tool in ("quantize --overwrite", "sample.py"):
            root = work / "hostile"
            shutil.rmtree(root, ignore_errors=True)
            (root / "victim").mkdir(parents=True)
            (root / "victim" / "precious.txt").write_text("keep")
            folder = root / "ck"
            shutil.copytree(source, folder, ignore=shutil.ignore_patterns(".*"))
            (folder / "link").symlink_to(root / "victim")
            if tool == "sample.py":
                (folder / STAGING_DIR).mkdir()
                (folder / STAGING_DIR / "COMPLETE").write_text(json.dumps(["config.json", entry]))
                command = [sys.executable, "sample.py", "--checkpoint", str(folder), "--prompt", "x",
                           "--max-new-tokens", "1"]
            else:
                (folder / ".contents").write_text(json.dumps(["config.json", entry]))
                command = [sys.executable, "quantize/dynamic.py", "--checkpoint", str(source), "--out-dir",
                           str(folder), "--overwrite", "--eval-batches", "1", "--repeats", "1", "--new-tokens", "1"]
            answer = run_command(command)
            error = last_error_line(answer.stderr)
            ok = (answer.returncode == 1 and (root / "victim" / "precious.txt").exists()
                  and f"lists {entry!r}, which is not a file inside" in error and "Traceback" not in answer.stderr)
            trials += 1
            failures += not ok
            if not ok or which == 0:
                notes.append(f"{tool}, entry {entry!r}: exit {answer.returncode}: {error}")
    return Drill("hostile .contents or journal", trials, failures, "-", notes=notes)
