"""train.py under the launchers users leave one machine with: two torchrun agents as two nodes on loopback
(the static --master-addr form and the c10d rendezvous), a rank killed under --max-restarts, and a
scheduler's SIGTERM followed by the same command.  One uninterrupted two-node run is the reference for all:
equal to one process within float tolerance, and to every interrupted run exactly."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

import train
from parallel.distributed import ParallelError, check_restartable_launch
from storage.artifact import load_model
from train import TrainConfig

STEPS = 16
GLOBAL_BATCH = 4  # sequences per step in every layout below
SETTINGS = dict(model="tiny", dataset="builtin", device="cpu", block_size=32, max_steps=STEPS, log_interval=1,
                eval_interval=1000, eval_batches=1, final_eval_batches=1, warmup_steps=2, lr=3e-3,
                checkpoint_interval=3)
FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()] + ["--batch-size", str(GLOBAL_BATCH // 2),
                                                                         "--no-curves"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def records(out) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def losses(out) -> list[float]:
    return [r["loss"] for r in records(out) if "loss" in r]


def steps_logged(out) -> list[int]:
    return [r["step"] for r in records(out) if "loss" in r]


def saved_step(out) -> int:
    try:
        return json.loads((out / "training_state" / "state.json").read_text())["step"]
    except (OSError, ValueError):
        return 0


def torchrun(launcher: list[str], out, *train_flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *launcher, "train.py", *FLAGS,
                             "--out-dir", str(out), *train_flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def finish(*jobs: subprocess.Popen) -> list[str]:
    """Wait for every job; each must exit 0.  Returns their standard outputs."""
    outputs = [job.communicate(timeout=300) for job in jobs]
    for job, (_, stderr) in zip(jobs, outputs):
        assert job.returncode == 0, stderr[-3000:]
    return [stdout for stdout, _ in outputs]


def two_nodes(launch, out, procs_per_node: int, *train_flags: str) -> None:
    finish(*[torchrun(["--nnodes", "2", f"--nproc_per_node={procs_per_node}", *launch(node)], out, *train_flags)
             for node in (0, 1)])


def assert_written_once(out) -> None:
    assert not (out / ".staging").exists()
    assert sorted(json.loads((out / ".contents").read_text())) == [
        "config.json", "model.safetensors", "training_state/optimizer.pt", "training_state/state.json"]
    assert steps_logged(out) == list(range(1, STEPS + 1))  # one writer: each step logged once


def weights(out) -> dict[str, torch.Tensor]:
    return load_model(out)[0].state_dict()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("launch")


@pytest.fixture(scope="module")
def single_process(root):
    train.train(TrainConfig(**SETTINGS, batch_size=GLOBAL_BATCH, curves=False, out_dir=str(root / "single")))
    return root / "single"


@pytest.fixture(scope="module")
def two_node_ddp(root):
    """docs/parallel.md's static multi-node form: node ranks, one master address and port."""
    out, port = root / "two-node-ddp", free_port()
    two_nodes(lambda node: ["--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port)],
              out, 1, "--parallel", "ddp")
    return out


def test_two_nodes_train_ddp_as_one_process_and_one_node_resumes(root, two_node_ddp, single_process):
    assert losses(two_node_ddp) == pytest.approx(losses(single_process), rel=1e-4)
    assert_written_once(two_node_ddp)
    parallel = [r for r in records(two_node_ddp) if "nodes" in r]
    assert {(p["nodes"], p["processes_per_node"], p["backend"], p["world_size"]) for p in parallel} == \
        {(2, 1, "gloo", 2)} and len(parallel) == STEPS
    # One node continues the two-node run, in one process; the global batch is kept.
    resumed = root / "resumed-on-one-node"
    shutil.copytree(two_node_ddp, resumed, ignore=shutil.ignore_patterns(".writer", ".swap", ".gate"))
    train.main(["--resume", "--out-dir", str(resumed), "--max-steps", str(STEPS + 2)])
    assert steps_logged(resumed) == list(range(1, STEPS + 3))


def test_two_nodes_by_rendezvous_train_fsdp_with_tensor_parallel_across_them(root, single_process):
    out, port = root / "two-node-fsdp-tp", free_port()
    two_nodes(lambda node: ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
                            "launch-test"], out, 1, "--parallel", "fsdp", "--tp-size", "2",
              "--batch-size", str(GLOBAL_BATCH))  # one data-parallel rank: tensor parallelism spans the nodes
    assert losses(out) == pytest.approx(losses(single_process), rel=1e-4)
    assert_written_once(out)
    parallel = [r for r in records(out) if "nodes" in r]
    assert {(p["nodes"], p["processes_per_node"], p["world_size"], p["dp_size"], p["tp_size"])
            for p in parallel} == {(2, 1, 2, 1, 2)} and len(parallel) == STEPS


def wait_for(condition, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_killed_rank_restarts_and_a_preempted_job_requeues_with_nothing_changed(tmp_path, two_node_ddp):
    """One job meets both: rank 1 is SIGKILLed under --max-restarts (torchrun restarts both ranks, which
    continue from the last checkpoint), then the scheduler's SIGTERM reaches the agent (every rank finishes
    its step, rank 0 saves it) and the same command is run again.  The final weights are the uninterrupted
    run's, bit for bit."""
    from bench.drills.drill import worker_pids
    out = tmp_path / "run"
    launch = ["--standalone", "--nproc_per_node=2", "--max-restarts=1"]
    job = torchrun(launch, out, "--parallel", "ddp", "--resume", "auto")
    wait_for(lambda: saved_step(out) >= 3, "the first checkpoint")
    wait_for(lambda: job.poll() is not None or len(steps_logged(out)) >= 4, "a step after it")
    trained_before_kill = max(steps_logged(out))
    os.kill(worker_pids(job.pid)[1], signal.SIGKILL)
    resumed_from = []

    def restarted_and_stepped() -> bool:  # the restarted ranks read the checkpoint and trained a step after it
        if job.poll() is not None:
            return True
        logged = steps_logged(out)
        if not resumed_from and logged and logged[-1] < trained_before_kill:
            resumed_from.append(logged[-1] - 1)
        return bool(resumed_from) and logged[-1] > resumed_from[0] + 1
    wait_for(restarted_and_stepped, "the restarted ranks")
    job.send_signal(signal.SIGTERM)
    stdout, stderr = job.communicate(timeout=120)
    resumed_at = int(next(line for line in stdout.splitlines() if line.startswith("resumed")).split()[-1])
    assert trained_before_kill - resumed_at <= 3  # at most one checkpoint interval lost
    stopped_at = saved_step(out)
    if "stopped by SIGTERM" in stderr:  # unless the run had already finished
        assert f"stopped by SIGTERM after step {stopped_at}" in stderr and "exit status 143" in stderr
        assert steps_logged(out)[-1] == stopped_at  # the step it finished was saved
        stdout, = finish(torchrun(launch, out, "--parallel", "ddp", "--resume", "auto"))
        assert f"resumed {out} at step {stopped_at}" in stdout
    assert steps_logged(out) == list(range(1, STEPS + 1))
    expected = weights(two_node_ddp)
    assert all(torch.equal(got, expected[name]) for name, got in weights(out).items())


def test_max_restarts_with_a_shared_rendezvous_store_is_refused_at_launch():
    shared = {"TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    with pytest.raises(ParallelError, match="launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun"):
        check_restartable_launch(shared)
    check_restartable_launch({**shared, "TORCHELASTIC_USE_AGENT_STORE": "False"})
    check_restartable_launch({**shared, "TORCHELASTIC_MAX_RESTARTS": "0"})
