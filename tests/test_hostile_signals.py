"""Stop signals and Ctrl-C at drawn moments of a training run and of a pruning run (tests/hostile.py's property).

Whatever the moment -- a training micro-batch, a validation batch, a checkpoint file being written or moved into
place, a pruning round -- the run exits 0 or 128 + the signal's number with no traceback, the folder holds one
whole checkpoint, the one its last message names (never a half-moved save, never a leftover `.staging/`), and a
stopped training run resumes to the losses of a run never stopped.

In process, each moment is an event the test counts (monkeypatched like tests/conftest.py's
`interrupt_training_at_batch`) and the signal is a real one sent to this process, so the run's own handlers (and
storage/folder.py's holding of signals during a move) take it.  In a subprocess, real timing: a signal some
time after a drawn step is logged.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import train
import training.checkpoint.checkpointer
import training.stop_signals
import training.trainer
from data.loader import WindowSampler
from model.gpt import GPT
import prune.report
from prune import iterative
from runtime.provenance import provenance
from storage.artifact import artifact_writers, load_model, model_state_for_saving, write_folder_atomically
from storage.folder import STAGING_DIR
from storage.training_state import OPTIMIZER_FILE, STATE_FILE
from tests.conftest import save_small_artifact, small_config
from tests.hostile import check_finished, examples

SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGUSR1": signal.SIGUSR1, "SIGINT": signal.SIGINT}
SIGNAL_EXITS = (130, 143, 138)
# Dropout on, so a stopped step whose RNG was not put back would change the resumed losses.  The model trained is
# `source`'s, smaller than --model tiny: each save writes its weights and optimizer state, several per example.
FLAGS = ["--dataset", "builtin", "--device", "cpu", "--batch-size", "2", "--block-size", "16", "--log-interval", "1",
         "--eval-interval", "2", "--eval-batches", "3", "--final-eval-batches", "2", "--warmup-steps", "2", "--lr",
         "2e-3", "--dropout", "0.1", "--no-curves", "--max-steps", "4"]


@pytest.fixture(autouse=True)
def terminal_signal_handlers():
    """Each signal reaches the code under test as it would in a fresh process (Ctrl-C as KeyboardInterrupt, the
    others by default), whatever handler an earlier test file on this pytest-xdist worker left installed."""
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for signum, handler in previous.items():
        if handler is not None:
            signal.signal(signum, handler)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    return save_small_artifact(tmp_path_factory.mktemp("source") / "model", n_layer=1, n_head=2, n_embd=16,
                               block_size=32)


@pytest.fixture(scope="module")
def run_flags(source) -> list[str]:
    return [*FLAGS, "--init-from", source]


class Moments:
    """Counts the events of a run in order and sends signals at chosen ones (event number -> signal), each sent
    before the event happens.  `after_first` lists the kinds of the events that followed the first signal."""

    def __init__(self, plan: dict[int, int] | None = None):
        self.plan, self.count, self.after_first = plan or {}, 0, []
        self.sent: list[int] = []

    def event(self, kind: str) -> None:
        self.count += 1
        if self.sent:
            self.after_first.append(kind)
        if self.count in self.plan:
            self.sent.append(self.plan[self.count])
            os.kill(os.getpid(), self.plan[self.count])


def count_save_events(monkeypatch, module, moments: Moments) -> None:
    """Each checkpoint file `module` writes, and each staged file moved into place, is an event."""
    real_write, real_replace = module.write_folder_atomically, os.replace

    def write(folder, writers, **kwargs):
        def counted(name, writer):
            def run(path):
                moments.event("write")
                writer(path)
            return run
        real_write(folder, {name: counted(name, w) for name, w in writers.items()}, **kwargs)

    def replace(src, dst, *args, **kwargs):
        if STAGING_DIR in Path(src).parts:
            moments.event("move")
        real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(module, "write_folder_atomically", write)
    monkeypatch.setattr(os, "replace", replace)


def count_training_events(monkeypatch, moments: Moments) -> None:
    """Training batches, validation batches (periodic and final; not a save's one-batch check) and saves."""
    real_next, real_eval_batches = WindowSampler.next_batch, training.trainer.eval_batches

    def next_batch(self):
        moments.event("batch")
        return real_next(self)

    def eval_batches(tokens, block, batch_size, windows):
        for batch in real_eval_batches(tokens, block, batch_size, windows):
            if windows != 1:
                moments.event("validation")
            yield batch

    monkeypatch.setattr(WindowSampler, "next_batch", next_batch)
    monkeypatch.setattr(training.trainer, "eval_batches", eval_batches)
    count_save_events(monkeypatch, training.checkpoint.checkpointer, moments)


def losses(out: Path) -> dict[int, float]:
    """step -> training loss; the last record wins, as a resumed run logs its steps again."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def saved_step(out: Path) -> int | None:
    """The step of the checkpoint in `out`, checked whole: no save left staged, the weights' step and the training
    state's agree, and the weights and the optimizer state load."""
    assert not (out / STAGING_DIR).exists(), "a save was left staged"
    if not (out / STATE_FILE).exists():
        assert not (out / "model.safetensors").exists(), "weights without a training state"
        return None
    step = json.loads((out / STATE_FILE).read_text())["step"]
    model, meta = load_model(out)
    assert meta.step == step and all(torch.isfinite(p).all() for p in model.parameters())
    torch.load(out / OPTIMIZER_FILE, weights_only=True)
    return step


def step_named(message: str) -> int | None:
    """The checkpoint a stop or interrupt message says the folder holds (None: no checkpoint yet)."""
    if "no checkpoint was written in this run yet" in message:
        return None
    named = re.search(r"the checkpoint of step (\d+) in .*, which is intact", message)
    assert named, f"the last line names no checkpoint: {message!r}"
    return int(named.group(1))


def finished(main, name: str, argv: list[str], capsys) -> subprocess.CompletedProcess:
    """A tool's `main` as a finished command: its exit status and what it printed (anything but SystemExit
    propagates: a traceback)."""
    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess([name, *argv], code, out, err)


def train_in_process(argv: list[str], capsys) -> subprocess.CompletedProcess:
    torch.manual_seed(0)  # a run from --init-from takes its dropout from the RNG as it finds it
    return finished(train.main, "train.py", argv, capsys)


@pytest.fixture(scope="module")
def uninterrupted(run_flags, tmp_path_factory):
    """For each --grad-accum: the losses of a run never stopped."""
    runs = {}

    def run(grad_accum: int) -> dict[int, float]:
        if grad_accum not in runs:
            out = tmp_path_factory.mktemp("uninterrupted")
            torch.manual_seed(0)  # as train_in_process does
            train.main([*run_flags, "--grad-accum", str(grad_accum), "--out-dir", str(out)])
            runs[grad_accum] = losses(out)
        return runs[grad_accum]
    return run


SIGNAL_PLANS = st.sampled_from(["SIGTERM", "SIGUSR1", "SIGINT", "SIGINT twice"])
TRAINING_EVENTS = 31  # a run of run_flags has 27 (--grad-accum 1) or 31 (2); a later first event sends nothing


# Issue 39's cases, as events of run_flags: N8, a second Ctrl-C while the stop saves step 3 (step 2 is on disk);
# N9, a SIGTERM at the second batch of step 2's validation, and one during the last micro-batch of step 2 (the
# step finishes and is saved: "saving step 2", not 1).
@example(plan="SIGINT twice", grad_accum=1, first=15, later=2)
@example(plan="SIGTERM", grad_accum=1, first=4, later=1)
@example(plan="SIGTERM", grad_accum=2, first=4, later=1)
@examples(3)
@given(plan=SIGNAL_PLANS, grad_accum=st.sampled_from([1, 2]), first=st.integers(1, TRAINING_EVENTS),
       later=st.integers(1, 8))
def test_a_stop_signal_at_any_moment_saves_the_announced_step_and_resumes_exactly(
        plan, grad_accum, first, later, uninterrupted, run_flags, tmp_path_factory, capsys):
    """The first signal at event `first`; with "SIGINT twice", a second Ctrl-C `later` events after it."""
    expected_losses = uninterrupted(grad_accum)
    signum = SIGNALS[plan.split()[0]]
    schedule = {first: signum, **({first + later: signal.SIGINT} if plan == "SIGINT twice" else {})}
    moments = Moments(schedule)
    out = tmp_path_factory.mktemp("stopped")
    run = [*run_flags, "--grad-accum", str(grad_accum), "--out-dir", str(out)]
    with pytest.MonkeyPatch.context() as monkeypatch:  # one per example: a function's fixture spans them all
        monkeypatch.setattr(training.stop_signals, "REPEATED_CTRL_C_S", 0.0)  # no launcher here repeats a Ctrl-C
        count_training_events(monkeypatch, moments)
        result = train_in_process(run, capsys)
    check_finished("train.py stop signals", result, SIGNAL_EXITS)
    on_disk = saved_step(out)
    if not moments.sent:  # the run ended before the drawn moment
        assert result.returncode == 0 and on_disk == 4
        return
    assert result.returncode == 128 + signum, result.stderr
    # Nothing trains after a stop signal, and no validation goes on: the one batch it may fetch is refused by the
    # stop check before it is evaluated.
    assert "batch" not in moments.after_first and moments.after_first.count("validation") <= 1, moments.after_first
    announced = re.findall(r"\w+: stopping (?:within|after) this micro-batch; saving step (\d+)", result.stderr)
    last_line = result.stderr.strip().splitlines()[-1]
    assert len(announced) == 1, result.stderr
    assert step_named(last_line) == on_disk, result.stderr
    if last_line.startswith("stopped by"):  # not cut short by a second Ctrl-C: the announced step was saved
        assert on_disk == int(announced[0]) and f"after step {on_disk};" in last_line
    else:
        assert len(moments.sent) == 2 and last_line.startswith("interrupted after step"), result.stderr

    resumed = train_in_process([*run, "--resume", "auto"], capsys)
    check_finished("train.py stop signals", resumed)
    assert resumed.returncode == 0 and saved_step(out) == 4
    assert losses(out) == pytest.approx(expected_losses, rel=1e-6, abs=0)


@examples(1)
@given(signal_name=st.sampled_from(sorted(SIGNALS)), after_step=st.integers(1, 3),
       delay_s=st.floats(0, 0.4), second_ctrl_c=st.booleans())
def test_a_signal_to_the_train_process_ends_it_with_its_status_and_a_whole_checkpoint(
        signal_name, after_step, delay_s, second_ctrl_c, run_flags, tmp_path_factory, capsys):
    """Real signals with real timing, to train.py as a scheduler or a terminal sends them: some time after step
    `after_step` is logged (each step is validated, so the moment often falls in a validation), then perhaps a
    second Ctrl-C once the first has been taken as one (training/stop_signals.py's REPEATED_CTRL_C_S)."""
    out = tmp_path_factory.mktemp("signalled")
    command = [sys.executable, "train.py", *run_flags, "--max-steps", "40", "--eval-interval", "1",
               "--eval-batches", "12", "--checkpoint-interval", "2", "--out-dir", str(out)]
    process = subprocess.Popen(command, cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        for line in process.stdout:
            if line.startswith(f"step {after_step}/"):
                break
        time.sleep(delay_s)
        process.send_signal(SIGNALS[signal_name])
        if second_ctrl_c and signal_name == "SIGINT":
            time.sleep(training.stop_signals.REPEATED_CTRL_C_S + 0.1)
            process.send_signal(signal.SIGINT)  # a no-op once the process has ended
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    check_finished("train.py stop signals", result, SIGNAL_EXITS)
    assert result.returncode in (0, 128 + SIGNALS[signal_name]), stderr
    on_disk = saved_step(out)
    if result.returncode:
        assert step_named(stderr.strip().splitlines()[-1]) == on_disk, stderr
    if on_disk is not None:
        resumed = train_in_process(["--resume", "--out-dir", str(out), "--max-steps", str(on_disk + 1)], capsys)
        check_finished("train.py stop signals", resumed)
        assert saved_step(out) == on_disk + 1


def test_a_stop_whose_save_would_outlast_the_grace_keeps_the_checkpoint_on_disk_and_says_so(run_flags, tmp_path,
                                                                                                capsys):
    """Once a save of the run has taken longer than the grace left, a stop does not start one the launcher's SIGKILL
    would cut short: it exits at once, naming the checkpoint already on disk."""
    real_next, batches = WindowSampler.next_batch, []

    def next_batch(self):
        batches.append(1)
        if len(batches) == 4:  # step 4's batch: step 2 is saved, step 3 is not
            os.kill(os.getpid(), signal.SIGTERM)
        return real_next(self)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(WindowSampler, "next_batch", next_batch)
        result = train_in_process([*run_flags, "--checkpoint-interval", "2", "--eval-interval", "100",
                                   "--stop-grace-s", "1e-9", "--out-dir", str(tmp_path / "run")], capsys)
    check_finished("train.py stop signals", result, SIGNAL_EXITS)
    last_line = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 143 and "; not saved: a save of this run takes" in last_line, result.stderr
    assert "SIGTERM: stopping within this micro-batch; not saving" in result.stderr, result.stderr
    assert step_named(last_line) == saved_step(tmp_path / "run") == 2
    assert "stopped by SIGTERM after step 3;" in last_line, last_line


# --- torchrun: a micro-batch longer than the launcher's grace ---------------------------------------------------

# tests/slow_blocks.py slows each of tiny's 4 blocks by SLOW_BLOCK_S in forward and again in backward: a micro-batch of
# 6 s or more against torchrun's --shutdown-timeout of GRACE_S, as GPT-2 Medium's 54 s against 30 s on a 2-core CPU.
SLOW_BLOCK_S, GRACE_S = 0.75, 5
TORCHRUN_FLAGS = ["--model", "tiny", "--dataset", "builtin", "--device", "cpu", "--batch-size", "2", "--block-size",
                  "32", "--max-steps", "3", "--log-interval", "1", "--final-eval-batches", "1", "--dropout", "0.1",
                  "--no-curves"]
ROOT = Path(__file__).resolve().parent.parent


def torchrun(script: str, mode: str, out: Path, *flags: str, slow: bool = False,
             launcher: str = "torch.distributed.run") -> subprocess.Popen:
    """A two-rank job in a session of its own, so that a Ctrl-C can reach all of it as a terminal's does; `launcher`:
    torchrun's module, or parallel.launch, torchrun without its traceback."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT),
           **({"SLOW_BLOCK_S": str(SLOW_BLOCK_S)} if slow else {})}
    return subprocess.Popen([sys.executable, "-m", launcher, "--standalone", "--nproc_per_node=2",
                             f"--shutdown-timeout={GRACE_S}", script, *TORCHRUN_FLAGS, "--parallel", mode,
                             "--out-dir", str(out), *flags], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.fixture(scope="module")
def torchrun_reference(tmp_path_factory):
    """Per layout: the losses of the job never stopped (and never slowed)."""
    runs = {}

    def run(mode: str) -> dict[int, float]:
        if mode not in runs:
            out = tmp_path_factory.mktemp(f"reference-{mode}")
            job = torchrun("train.py", mode, out)
            _, stderr = job.communicate(timeout=300)
            assert job.returncode == 0, stderr[-3000:]
            runs[mode] = losses(out)
        return runs[mode]
    return run


@examples(1)
@given(into_step_s=st.floats(0.2, 4.0))
@pytest.mark.parametrize("mode, launcher", [("tp", "torch.distributed.run"), ("fsdp", "parallel.launch")])
def test_a_ctrl_c_in_a_micro_batch_longer_than_torchruns_grace_saves_the_last_whole_step(
        mode, launcher, into_step_s, torchrun_reference, tmp_path_factory):
    """Ctrl-C (to the whole job, as a terminal sends it) `into_step_s` into step 2, whose one micro-batch outlasts
    torchrun's grace: the ranks abandon it at the same block, forward or backward, with step 1 on disk before
    torchrun's SIGKILL (saved when it ended, as its micro-batch outlasts half the grace), and say so in one closing
    line; the resumed run's losses equal those of a run never stopped.  Under
    torchrun the agent's own traceback follows; under parallel.launch the job's closing line is the last."""
    out = tmp_path_factory.mktemp(f"stopped-{mode}")
    job = torchrun("tests/slow_blocks.py", mode, out, slow=True, launcher=launcher)
    try:
        for line in job.stdout:
            if line.startswith("step 1: checkpoint saved"):  # at once, as its micro-batch outlasts half the grace
                break
        time.sleep(into_step_s)
        os.killpg(job.pid, signal.SIGINT)
        _, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    if launcher == "parallel.launch":
        assert job.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
        assert stderr.strip().splitlines()[-1].startswith("stopped by SIGINT"), stderr[-3000:]
    else:  # torchrun's agent re-raises the signal after its workers exit: its own traceback, the ranks' none.  (A
        # SIGINT that lands on the first line of the agent's metrics wrapper chains torch's own UnboundLocalError
        # after it, seen once on a fresh clone: the traceback is still all torch's.)
        ours = rf'File "({re.escape(str(ROOT))}/(?!\.venv/)|[^/<"])'  # a frame of the checkout's, or of a relative path
        assert "got signal: 2" in stderr and not re.search(ours, stderr), stderr[-3000:]
    assert "forcefully exiting" not in stderr, stderr[-3000:]  # no rank outlived the grace
    closing = [line for line in stderr.splitlines() if line.startswith("stopped by")]
    assert len(closing) == 1 and closing[0].startswith("stopped by SIGINT after step 1;"), stderr[-3000:]
    assert re.search(r"SIGINT: stopping within this micro-batch; step 1 is on disk already \(the grace before a "
                     rf"SIGKILL: {GRACE_S} s, torchrun --shutdown-timeout {GRACE_S}\)", stderr), stderr[-3000:]
    assert step_named(closing[0]) == saved_step(out) == 1

    job = torchrun("train.py", mode, out, "--resume")
    _, stderr = job.communicate(timeout=300)
    assert job.returncode == 0, stderr[-3000:]
    assert losses(out) == torchrun_reference(mode)


# --- pruning ----------------------------------------------------------------------------------------------------

PRUNE = ["--dataset", "builtin", "--target", "0.5", "--rounds", "2", "--finetune-steps", "1", "--batch-size", "2",
         "--block-size", "16", "--eval-batches", "1", "--speed-batch", "1", "--speed-seq-len", "8",
         "--speed-repeats", "1", "--generation-tokens", "2", "--warmup-steps", "1"]
PRUNE_EVENTS = 30  # a run of PRUNE has 24: a draw past its last event lets the run finish


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A small model's weights stored as float32, float16 and bfloat16, each as a train.py checkpoint would be."""
    root = tmp_path_factory.mktemp("sources")
    torch.manual_seed(0)
    model = GPT(small_config(n_layer=1, n_head=2, n_embd=16, block_size=32))
    folders = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        state = {name: t.to(dtype) for name, t in model_state_for_saving(model).items()}
        folders[dtype] = root / str(dtype).removeprefix("torch.")
        write_folder_atomically(folders[dtype], artifact_writers(state, model.config, "float", provenance("train.py"),
                                                                 extra={"step": 1}))
    return folders


# Issue 39's cases: N14, float16 weights through every round and its CSR timing; N15, a Ctrl-C at round 2's first
# file (round 1 is on disk), and one while round 2 is moved into place (held until it is: round 2 is on disk).
@example(dtype=torch.float16, method="magnitude", ctrl_c_at=PRUNE_EVENTS)
@example(dtype=torch.float32, method="magnitude", ctrl_c_at=14)
@example(dtype=torch.float32, method="magnitude", ctrl_c_at=21)
@examples(2)
@given(dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
       method=st.sampled_from(["magnitude", "wanda"]), ctrl_c_at=st.integers(1, PRUNE_EVENTS))
def test_pruning_any_stored_dtype_and_a_ctrl_c_anywhere_names_the_round_on_disk(
        dtype, method, ctrl_c_at, checkpoints, tmp_path_factory, capsys):
    """Issue 39's N14 (float16 weights failed in the CSR speed check) and N15 (a Ctrl-C during round 3's save
    named round 3 while round 2 was on disk)."""
    moments, real_finetune = Moments({ctrl_c_at: signal.SIGINT}), iterative.finetune

    def finetune(*args, **kwargs):
        moments.event("finetune")
        return real_finetune(*args, **kwargs)
    out = tmp_path_factory.mktemp("pruned") / "out"
    argv = [*PRUNE, "--method", method, "--checkpoint", str(checkpoints[dtype]), "--out-dir", str(out)]
    with pytest.MonkeyPatch.context() as monkeypatch:
        count_save_events(monkeypatch, iterative, moments)
        monkeypatch.setattr(iterative, "finetune", finetune)
        for plot in ("plot_loss", "plot_speed"):  # matplotlib takes longer than the rest of a round: a stand-in file
            monkeypatch.setattr(prune.report, plot, lambda report, path: path.write_bytes(b"plot"))
        result = finished(iterative.main, "prune/iterative.py", argv, capsys)
    code, err = result.returncode, result.stderr
    check_finished("prune/iterative.py Ctrl-C", result, (130,))

    assert not (out / STAGING_DIR).exists()
    on_disk = load_model(out)[1].pruning["round"] if (out / "config.json").exists() else 0
    report_rounds = (json.loads((out / "prune_report.json").read_text())["methods"][method]["rounds"]
                     if on_disk else [])
    assert [r["round"] for r in report_rounds] == list(range(on_disk + 1 if on_disk else 0))
    if not moments.sent:
        assert code == 0 and on_disk == 2
        # Half-precision weights are read into the float32 model (storage/weights.py), so every round, the CSR
        # speed check included, runs in float32.
        assert report_rounds[-1]["csr"]["forward_tokens_per_s"] > 0
        assert load_model(out)[0].transformer.wte.weight.dtype == torch.float32
        return
    assert code == 130
    last_line = err.strip().splitlines()[-1]
    if on_disk:
        assert f"round {on_disk}'s checkpoint and report in {out} are intact" in last_line, err
    else:
        assert "no round had been saved" in last_line, err
