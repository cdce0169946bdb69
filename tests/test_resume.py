"""Resuming a run: it keeps its own settings, applies the changes a command line may make, refuses the ones
it may not, and `--resume auto` starts or continues by itself (for restarting launchers)."""
import json
import re
from types import SimpleNamespace

import pytest

import train
from model.config import preset
from model.gpt import GPT
from parallel import MODES
from parallel.layout import strategy_named
from tests.conftest import interrupt_training_at_batch
from training.trainer import Trainer

RUN = ["--model", "tiny", "--dataset", "builtin", "--device", "cpu", "--batch-size", "4", "--block-size", "32",
       "--log-interval", "1", "--eval-interval", "100", "--eval-batches", "1", "--final-eval-batches", "1",
       "--warmup-steps", "2", "--lr", "2e-3", "--no-curves"]


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


def test_sigusr1_in_one_process_saves_the_step_and_exits_138(tmp_path, monkeypatch, capsys):
    """Slurm's early warning reaching train.py: the step in progress finishes and is saved."""
    import os
    import signal

    from data.loader import WindowSampler
    real_next, calls = WindowSampler.next_batch, {"n": 0}

    def warned_at_third_batch(self):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGUSR1)
        return real_next(self)

    monkeypatch.setattr(WindowSampler, "next_batch", warned_at_third_batch)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        train.main([*RUN, "--max-steps", "8", "--checkpoint-interval", "100", "--out-dir", str(out)])
    assert exit_info.value.code == 138
    assert json.loads((out / "training_state" / "state.json").read_text())["step"] == 3
    assert "stopped by SIGUSR1 after step 3" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the handler is the run's only


def final_weights(out) -> dict:
    from safetensors.torch import load_file
    return load_file(out / "model.safetensors")


def test_sigterm_mid_step_stops_within_the_micro_batch_and_resumes_to_the_uninterrupted_weights(tmp_path, monkeypatch,
                                                                                                 capsys):
    """SIGTERM during the second micro-batch of step 3 (of 4 per step): in one process the micro-batch stops at its
    next block (training/stop_points.py), the step is dropped, step 2 is saved with
    its data position and RNG, and the resumed run ends with the weights of a run never stopped (dropout on, so a
    wrong RNG would show)."""
    import os
    import signal

    import torch

    from data.loader import WindowSampler
    run = [*RUN, "--grad-accum", "4", "--dropout", "0.1", "--max-steps", "4", "--checkpoint-interval", "100"]
    train.main([*run, "--out-dir", str(tmp_path / "whole")])
    real_next, calls = WindowSampler.next_batch, {"n": 0}

    def terminated_in_step_3(self):
        calls["n"] += 1
        if calls["n"] == 2 * 4 + 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_next(self)

    monkeypatch.setattr(WindowSampler, "next_batch", terminated_in_step_3)
    out = tmp_path / "stopped"
    with pytest.raises(SystemExit) as exit_info:
        train.main([*run, "--out-dir", str(out)])
    assert exit_info.value.code == 143 and calls["n"] == 10  # no micro-batch after the one under way
    err = capsys.readouterr().err
    assert "SIGTERM: stopping within this micro-batch; saving step 2" in err and "stopped by SIGTERM after step 2" in err
    assert json.loads((out / "training_state" / "state.json").read_text())["step"] == 2
    monkeypatch.setattr(WindowSampler, "next_batch", real_next)
    train.main([*run, "--out-dir", str(out), "--resume"])
    whole, resumed = final_weights(tmp_path / "whole"), final_weights(out)
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)


def test_the_first_micro_batch_gives_an_estimate_and_gpu_sized_runs_are_named(tmp_path, capsys):
    import torch

    from training.estimate import RunEstimate, duration
    train.main([*RUN, "--grad-accum", "2", "--max-steps", "3", "--out-dir", str(tmp_path / "run")])
    out = capsys.readouterr().out
    took = r"[\d.]+ m?s"  # a fast step is in milliseconds
    assert re.search(rf"first micro-batch [\d.]+ s \(warm-up included\): about {took} per step of 2 micro-batches, "
                     rf"about {took} for the 3 steps to go", out)
    assert re.search(rf"step 1/3: .* tokens/s, {took} left", out) and "sized for a GPU" not in out
    lines = RunEstimate(20000, 32, torch.device("cpu")).first_micro_batch(80.0)
    assert lines[0].endswith("about 43 min per step of 32 micro-batches, about 592 days 14 h for the 20,000 steps "
                             "to go")
    assert lines[1].startswith("this run is sized for a GPU: about 43 min per step here, 592 days 14 h in all")
    assert len(RunEstimate(20000, 32, torch.device("cuda")).first_micro_batch(80.0)) == 1
    assert [duration(s) for s in (0.04, 2.5, 45, 600, 7800, 200000)] == \
        ["40 ms", "2.5 s", "45 s", "10 min", "2 h 10 min", "2 days 7 h"]


@pytest.mark.parametrize("grace_s, first_saved", [(0.001, True), (3600.0, False)])
def test_the_first_step_is_saved_at_once_when_a_micro_batch_takes_half_the_grace(tmp_path, capsys, grace_s,
                                                                                  first_saved):
    """A micro-batch of half the grace or more cannot be waited for at a stop, and a save may not fit what is left:
    the first step a process trains is then on disk before any stop, new run or resumed; otherwise the interval
    alone decides."""
    out = tmp_path / "run"
    flags = [*RUN, "--checkpoint-interval", "100", "--stop-grace-s", str(grace_s), "--out-dir", str(out)]
    train.main([*flags, "--max-steps", "3"])
    saved = [line for line in capsys.readouterr().out.splitlines() if "checkpoint saved" in line]
    assert [line.split(":")[0] for line in saved] == (["step 1", "step 3"] if first_saved else ["step 3"])
    train.main([*flags, "--max-steps", "5", "--resume"])
    saved = [line for line in capsys.readouterr().out.splitlines() if "checkpoint saved" in line]
    assert [line.split(":")[0] for line in saved] == (["step 4", "step 5"] if first_saved else ["step 5"])


@pytest.mark.parametrize("mode", sorted(MODES))
def test_stop_points_are_installed_where_the_strategy_runs_the_blocks_in_the_steps_thread(mode):
    """A property of the strategy (nn.DataParallel runs its replicas' blocks in threads of its own), not a mode
    string the trainer compares; and never under --compile."""
    strategy = strategy_named(mode)
    trainer = SimpleNamespace(cfg=SimpleNamespace(compile=False), par=SimpleNamespace(strategy=strategy),
                              model=GPT(preset("tiny")), finishing_step=False)
    points = Trainer.install_stop_points(trainer, stop_signals=None)
    assert (points is not None) == (mode != "dp") == strategy.blocks_run_in_calling_thread
    if points is not None:
        points.remove()
    trainer.cfg.compile = True
    assert Trainer.install_stop_points(trainer, stop_signals=None) is None
