"""Every command stops on SIGINT and SIGTERM however it was started (runtime/stopping.py; tests/hostile.py's property).

Each command is started as a script's `cmd &` starts it, with SIGINT ignored, and sent SIGINT or SIGTERM at a drawn
moment from the start of its script (its first line takes the signals: torch still being imported is included;
before it, the interpreter starting up, no program can say anything).  Whatever the moment, it exits 0 (it had
finished) or 128 + the signal's number with its one closing line, `stopped by SIG... ; exit status N`, and no
traceback; and nothing is left half-written: no staged save, an artifact on disk loads, every result line is whole
JSON, a scorecard is absent or whole JSON whose every figure has its status (what was measured before the stop
kept), and no training run the scorecard started outlives it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bench.eval.score_file import FIGURES
from storage.artifact import load_model
from storage.folder import STAGING_DIR
from tests.conftest import save_small_artifact
from tests.hostile import check_finished, examples
from tests.source_tree import ROOT

SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}
COMMANDS = ("train", "prune", "quantize", "sample", "scorecard")
# The moment is drawn within the first this many seconds: the runs below take several times that on a busy
# 2-core host, so most draws fall inside them (imports, loading, the work itself), and a late one lets a run finish.
LATEST_S = 8.0


def argv(command: str, source: Path, out: Path, prompts: Path) -> list[str]:
    """The command on a model small enough that a whole run takes seconds."""
    small = {
        "train": ["train.py", "--init-from", str(source), "--dataset", "builtin", "--device", "cpu", "--batch-size",
                  "2", "--block-size", "16", "--max-steps", "8", "--eval-interval", "4", "--eval-batches", "2",
                  "--final-eval-batches", "2", "--no-curves", "--log-interval", "1", "--out-dir", str(out)],
        "prune": ["prune/iterative.py", "--checkpoint", str(source), "--out-dir", str(out), "--dataset", "builtin",
                  "--target", "0.5", "--rounds", "2", "--finetune-steps", "1", "--batch-size", "2", "--block-size",
                  "16", "--eval-batches", "1", "--speed-batch", "1", "--speed-seq-len", "8", "--speed-repeats", "1",
                  "--generation-tokens", "2", "--warmup-steps", "1"],
        "quantize": ["quantize/dynamic.py", "--checkpoint", str(source), "--out-dir", str(out), "--dataset",
                     "builtin", "--eval-batches", "2", "--eval-batch-size", "2", "--prompt-tokens", "8",
                     "--new-tokens", "4", "--repeats", "1"],
        "sample": ["sample.py", "--checkpoint", str(source), "--prompts-file", str(prompts), "--output",
                   str(out / "results.jsonl"), "--max-new-tokens", "8", "--batch-size", "1"],
        "scorecard": ["bench/leaderboard.py", "--checkpoint", str(source), "--dataset", "builtin", "--new-tokens",
                      "4", "--prompt-tokens", "4", "--repeats", "1", "--train-steps", "1", "--block-size", "16",
                      "--eval-batch-size", "2", "--out", str(out / "score.json")],
    }
    return [sys.executable, *small[command]]


def started_in_the_background() -> None:
    """What a shell does for `cmd &` in a script (job control off): SIGINT and SIGQUIT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return Path(save_small_artifact(tmp_path_factory.mktemp("stops") / "model", n_layer=1, n_head=2, n_embd=16,
                                    block_size=32))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": "word " * n}) + "\n" for n in range(1, 7)))
    return path


def caught_signals(pid: int) -> int:
    """The mask of signals the process has handlers for (/proc/PID/status SigCgt); 0 once it has ended."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)


def wait_for_the_script_to_begin(process: subprocess.Popen) -> None:
    """Until its first line has taken SIGTERM (runtime/stopping.py's `note_stops_while_starting`)."""
    deadline = time.monotonic() + 120
    while not caught_signals(process.pid) & (1 << (signal.SIGTERM - 1)):
        assert process.poll() is None and time.monotonic() < deadline, "the command never took SIGTERM"
        time.sleep(0.005)


def processes_naming(text: str) -> list[str]:
    """The command lines of the processes running now that mention `text` (this process's children's, say)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:  # ended meanwhile
            continue
        line = " ".join(w.decode(errors="replace") for w in words)
        if text in line and "pytest" not in line:
            found.append(line)
    return found


def check_nothing_half_written(command: str, out: Path, source: Path) -> None:
    if not out.exists():
        return
    assert not list(out.rglob(STAGING_DIR)), f"{command}: a save was left staged"
    assert not list(out.rglob("*.partial")), f"{command}: a partial file was left"
    if (out / "config.json").exists():  # train, prune, quantize: the artifact there is whole
        load_model(out)
    if (out / "results.jsonl").exists():
        for line in (out / "results.jsonl").read_text().splitlines():
            json.loads(line)
    if (out / "score.json").exists():
        score = json.loads((out / "score.json").read_text())
        assert set(score["status"]) == set(FIGURES) and "loss" in score
    for _ in range(50):  # the scorecard's training runs end with it (SIGKILL to their session: at once)
        if not processes_naming(f"--init-from {source}"):
            break
        time.sleep(0.1)
    assert not processes_naming(f"--init-from {source}"), f"{command}: a child outlived it"


@example(command="prune", signal_name="SIGINT", delay_s=5.0)
@example(command="quantize", signal_name="SIGTERM", delay_s=4.0)
@example(command="sample", signal_name="SIGINT", delay_s=3.0)
@example(command="scorecard", signal_name="SIGTERM", delay_s=LATEST_S)
@examples(4)
@given(command=st.sampled_from(COMMANDS), signal_name=st.sampled_from(sorted(SIGNALS)),
       delay_s=st.floats(0, LATEST_S))
def test_a_command_started_in_the_background_stops_on_sigint_and_sigterm_with_its_closing_line(
        command, signal_name, delay_s, source, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp(command) / "out"
    signum = SIGNALS[signal_name]
    process = subprocess.Popen(argv(command, source, out, prompts), cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=started_in_the_background,
                               env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    try:
        wait_for_the_script_to_begin(process)
        time.sleep(delay_s)
        process.send_signal(signum)  # a no-op once it has ended
        stdout, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    check_finished(f"{command} stop signals", result, (128 + signum,))
    assert result.returncode in (0, 128 + signum), f"{command} exit {result.returncode}:\n{stderr[-3000:]}"
    if result.returncode:
        last = stderr.strip().splitlines()[-1]
        assert last.startswith(f"stopped by {signal_name}") and last.endswith(f"; exit status {128 + signum}"), \
            f"{command}: last line {last!r}"
    check_nothing_half_written(command, out, source)
