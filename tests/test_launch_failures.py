"""`python -m parallel.launch` (torchrun's flags, torchrun's agent) ends a failed job with one line of its own: the rank
that failed first and how, its signal named ("SIGKILL: likely out of memory"), where `torchrun` prints a traceback and
a table; a job whose ranks stopped on SIGTERM exits 143, as each rank did; and an error every rank meets is printed
once (parallel/job_lines.py)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from parallel.job_lines import print_once_per_job
from parallel.launch import job_status

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def failed(*exitcodes: int) -> ChildFailedError:
    """A ChildFailedError whose rank i ended with exitcodes[i], rank 0 first (torchrun's negative code: a signal)."""
    failures = {}
    for rank, code in enumerate(exitcodes):
        failures[rank] = ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=code, error_file="<N/A>")
        failures[rank].timestamp = rank  # rank 0 failed first
    return ChildFailedError("train.py", failures)


@pytest.mark.parametrize("exitcodes, status, line", [
    ((-9, -15), 137, "error: rank 0 (local rank 0, pid 100) was ended by SIGKILL: likely out of memory"),
    ((1, -15), 1, "rank 0 (local rank 0, pid 100) failed first, with exit status 1 (its own message is above)"),
    ((-11, 1), 139, "error: rank 0 (local rank 0, pid 100) was ended by SIGSEGV"),
    ((143, -15), 143, None),  # the ranks stopped on SIGTERM and rank 0 said so: its status is the job's
    ((130, 130), 130, None),
])
def test_a_failed_job_ends_with_one_line_naming_the_first_rank_and_how(exitcodes, status, line):
    got_status, got_line = job_status(failed(*exitcodes))
    assert got_status == status
    if line is None:
        assert got_line is None
    else:
        assert got_line.startswith(line) and "\n" not in got_line
        assert ("likely out of memory" in got_line) == (exitcodes[0] == -9)


def launch(tmp_path, body: str, *launcher_flags: str) -> subprocess.CompletedProcess:
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, "-m", "parallel.launch", "--standalone", "--nproc_per_node=2",
                           *launcher_flags, str(script)], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=180)


def test_a_rank_the_kernel_kills_is_named_in_the_last_line_without_torchruns_traceback(tmp_path):
    job = launch(tmp_path, """
        import os, signal, time
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer ends a rank
        time.sleep(60)
    """)
    assert job.returncode == 137, job.stderr
    assert job.stderr.strip().splitlines()[-1].startswith(
        "error: rank 1 (local rank 1, pid "), job.stderr
    assert "SIGKILL: likely out of memory" in job.stderr
    assert "Traceback" not in job.stderr and "ChildFailedError" not in job.stderr and "exitcode" not in job.stderr


def test_ranks_stopped_by_sigterm_give_the_job_their_status(tmp_path):
    job = launch(tmp_path, """
        import os, sys
        if os.environ["RANK"] == "0":
            print("stopped by SIGTERM after step 3; exit status 143", file=sys.stderr)
        sys.exit(143)
    """)
    assert job.returncode == 143, job.stderr
    assert "stopped by SIGTERM after step 3; exit status 143" in job.stderr.splitlines()
    assert "Traceback" not in job.stderr and "error:" not in job.stderr


def test_an_error_every_rank_meets_is_printed_once(tmp_path):
    """train.py under the launcher with a context longer than the model's: each rank refuses it alike."""
    job = subprocess.run([sys.executable, "-m", "parallel.launch", "--standalone", "--nproc_per_node=2", "train.py",
                          "--parallel", "ddp", "--device", "cpu", "--block-size", "100000", "--out-dir",
                          str(tmp_path / "run")], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert job.returncode == 1
    errors = [line for line in job.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "--block-size 100000 is larger than the model's context" in errors[0], job.stderr
    assert job.stderr.strip().splitlines()[-1].endswith("failed first, with exit status 1 (its own message is above)")
    assert "Traceback" not in job.stderr


def test_a_line_is_printed_once_per_job_attempt_and_a_different_line_too(monkeypatch, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10))  # the agent's, here
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    for line in ("error: a", "error: a", "error: b"):
        print_once_per_job(line)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a restarted attempt says its errors again
    print_once_per_job("error: a")
    assert capsys.readouterr().err.splitlines() == ["error: a", "error: b", "error: a"]
    del store
    monkeypatch.setenv("MASTER_PORT", str(port))  # the store gone: said, not lost
    print_once_per_job("error: c")
    assert capsys.readouterr().err.splitlines() == ["error: c"]
