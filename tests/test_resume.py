"""Resuming a run: it keeps its own settings, applies the changes a command line may make, refuses the ones
it may not, and `--resume auto` starts or continues by itself (for restarting launchers)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import train
from tests.conftest import interrupt_training_at_batch

RUN = ["--model", "tiny", "--dataset", "builtin", "--device", "cpu", "--batch-size", "4", "--block-size", "32",
       "--log-interval", "1", "--eval-interval", "100", "--eval-batches", "1", "--final-eval-batches", "1",
       "--warmup-steps", "2", "--lr", "2e-3"]


def records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def steps_logged(out) -> list[int]:
    return [r["step"] for r in records(out) if "loss" in r]


def saved_config(out) -> dict:
    return json.loads((out / "training_state" / "state.json").read_text())["train_config"]


def error_of(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    return str(exit_info.value.code)


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory):
    """A 6-step run interrupted after step 4, with a checkpoint at step 3; returns a copy maker."""
    import shutil
    root = tmp_path_factory.mktemp("resume")
    monkeypatch = pytest.MonkeyPatch()
    undo = interrupt_training_at_batch(monkeypatch, 5)
    with pytest.raises(SystemExit):
        train.main([*RUN, "--max-steps", "6", "--checkpoint-interval", "3", "--out-dir", str(root / "run")])
    undo()

    def copy(name):
        shutil.copytree(root / "run", root / name, ignore=shutil.ignore_patterns(".writer", ".swap", ".gate"))
        return root / name
    return copy


def test_a_bare_resume_keeps_every_saved_setting(interrupted_run, capsys):
    out = interrupted_run("bare")
    capsys.readouterr()
    train.main(["--resume", "--out-dir", str(out)])  # no other flag: nothing falls back to a default
    printed = capsys.readouterr().out
    assert "resumed" in printed and "resume:" not in printed and "step 6/6:" in printed
    assert steps_logged(out) == [1, 2, 3, 4, 5, 6]
    config = saved_config(out)
    assert (config["max_steps"], config["batch_size"], config["block_size"], config["lr"]) == (6, 4, 32, 2e-3)
    assert (config["log_interval"], config["checkpoint_interval"]) == (1, 3)


def test_a_resume_applies_the_changes_it_may_make_and_says_so(interrupted_run, capsys):
    out = interrupted_run("longer")
    capsys.readouterr()
    train.main(["--resume", "--out-dir", str(out), "--max-steps", "8", "--log-interval", "2"])
    printed = capsys.readouterr().out
    assert ("resume: --max-steps 8 (was 6), so the learning-rate schedule now ends at step 8; --log-interval 2 "
            "(was 1)") in printed
    assert steps_logged(out) == [1, 2, 3, 4, 6, 8]
    assert saved_config(out)["max_steps"] == 8


def test_a_resume_refuses_what_it_cannot_change_by_name(interrupted_run, capsys):
    out = interrupted_run("refused")
    message = error_of(["--resume", "--out-dir", str(out), "--lr", "0.5", "--seed", "9", "--model", "gpt2"], capsys)
    assert message.startswith(f"error: {out} holds a run trained with --model tiny, --lr 0.002, --seed 1337; a "
                              f"resumed run cannot change that (--model gpt2, --lr 0.5, --seed 9 asked)")
    message = error_of(["--resume", "--out-dir", str(out), "--max-steps", "2"], capsys)
    assert message.startswith(f"error: --max-steps 2 is below step 3, where {out} was saved")
    # The same values as the saved ones are not changes.
    assert steps_logged(out) == [1, 2, 3, 4]
    train.main([*RUN, "--resume", "--out-dir", str(out), "--max-steps", "6", "--checkpoint-interval", "3"])
    assert steps_logged(out) == [1, 2, 3, 4, 5, 6]


def test_resume_auto_starts_fresh_continues_and_refuses_another_run(interrupted_run, tmp_path, capsys):
    fresh = tmp_path / "fresh"
    train.main([*RUN, "--resume", "auto", "--max-steps", "2", "--out-dir", str(fresh)])
    assert steps_logged(fresh) == [1, 2] and "resumed" not in capsys.readouterr().out

    out = interrupted_run("auto")
    train.main([*RUN, "--resume", "auto", "--max-steps", "6", "--checkpoint-interval", "3", "--out-dir", str(out)])
    assert "resumed" in capsys.readouterr().out and steps_logged(out) == [1, 2, 3, 4, 5, 6]

    other = interrupted_run("other")  # the command line describes another run: defaults count under auto
    message = error_of(["--resume", "auto", "--max-steps", "6", "--out-dir", str(other)], capsys)
    assert message.startswith(f"error: {other} holds a run trained with --batch-size 4, --block-size 32, --lr "
                              f"0.002, --warmup-steps 2; a resumed run cannot change that")
    assert error_of([*RUN, "--resume", "auto", "--overwrite", "--out-dir", str(other)], capsys).startswith(
        "error: --resume auto continues the run in --out-dir and --overwrite replaces it")


ELASTIC_STEPS = 16


def ddp_job(out, *launcher_flags) -> list[str]:
    """A 2-rank DDP job as a launcher restarts it: the same command every time, with --resume auto."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *launcher_flags,
            "train.py", *RUN, "--parallel", "ddp", "--max-steps", str(ELASTIC_STEPS), "--checkpoint-interval", "3",
            "--resume", "auto", "--out-dir", str(out)]


def start(command, **env) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                                 **env})


def wait_for(condition, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def saved_step(out) -> int:
    try:
        return json.loads((out / "training_state" / "state.json").read_text())["step"]
    except (OSError, ValueError):
        return 0


@pytest.fixture(scope="module")
def uninterrupted_weights(tmp_path_factory):
    from model.artifact import load_model
    out = tmp_path_factory.mktemp("elastic") / "uninterrupted"
    job = start(ddp_job(out))
    _, stderr = job.communicate(timeout=180)
    assert job.returncode == 0, stderr[-2000:]
    return load_model(out)[0].state_dict()


def assert_same_weights(out, expected) -> None:
    from model.artifact import load_model
    got = load_model(out)[0].state_dict()
    assert all(torch.equal(got[name], expected[name]) for name in expected)


def test_a_rank_killed_under_max_restarts_recovers_exactly(tmp_path, uninterrupted_weights):
    from bench.experiments.faults import worker_pids
    out = tmp_path / "run"
    job = start(ddp_job(out, "--max-restarts=1"))
    wait_for(lambda: saved_step(out) >= 3, "the first checkpoint")
    wait_for(lambda: job.poll() is not None or len(steps_logged(out)) >= 4, "a step after it")
    trained_before_kill = max(steps_logged(out))
    os.kill(worker_pids(job.pid)[1], signal.SIGKILL)
    stdout, stderr = job.communicate(timeout=180)
    assert job.returncode == 0, stderr[-2000:]
    resumed_at = int(next(line for line in stdout.splitlines() if line.startswith("resumed")).split()[-1])
    assert trained_before_kill - resumed_at <= 3  # at most one checkpoint interval lost
    assert steps_logged(out) == list(range(1, ELASTIC_STEPS + 1))
    assert_same_weights(out, uninterrupted_weights)


def test_max_restarts_with_a_shared_rendezvous_store_is_refused_at_launch(tmp_path):
    job = start(ddp_job(tmp_path / "run", "--max-restarts=1"), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="0")
    _, stderr = job.communicate(timeout=120)
    assert job.returncode != 0 and not (tmp_path / "run").exists()
    assert "error: torchrun --max-restarts cannot restart these workers while its rendezvous store is shared" in stderr


def test_sigterm_finishes_the_step_saves_and_the_requeued_job_loses_nothing(tmp_path, uninterrupted_weights):
    """As a scheduler's preemption: SIGTERM to the torchrun agent, then the same command again."""
    out = tmp_path / "run"
    job = start(ddp_job(out))
    wait_for(lambda: len(steps_logged(out)) >= 4 if (out / "metrics.jsonl").exists() else False, "step 4")
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=120)
    stopped_at = saved_step(out)
    assert 4 <= stopped_at and steps_logged(out)[-1] == stopped_at  # saved the step it finished
    assert f"stopped by SIGTERM after step {stopped_at}" in stderr and "exit status 143" in stderr
    if stopped_at < ELASTIC_STEPS:
        requeued = start(ddp_job(out))
        stdout, stderr = requeued.communicate(timeout=180)
        assert requeued.returncode == 0, stderr[-2000:]
        assert f"resumed {out} at step {stopped_at}" in stdout
    assert steps_logged(out) == list(range(1, ELASTIC_STEPS + 1))
    assert_same_weights(out, uninterrupted_weights)
