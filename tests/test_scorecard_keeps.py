"""The scorecard keeps its work (bench/eval/score_file.py): each figure is in --out as soon as it is measured, a
failed training sub-run is one line naming its cause (a signal: likely out of memory), and `--resume` / `--only`
finish the missing figures without measuring the kept ones again."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import leaderboard
from bench.eval import scorecard
from bench.processes import run_command
from bench.train_runs import TrainRun
from tests.conftest import save_small_artifact

TEXT = ("The quick brown fox jumps over the lazy dog while the committee debates the budget for the new "
        "railway station, which was opened in 1887 and rebuilt after the war. ") * 30
# torchrun's own report when the kernel's OOM killer ends rank 0 (torch/distributed/elastic's failure table).
OOM_KILLED = """[rank1]: Traceback (most recent call last):
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-28_10:01:02
  host      : host
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 4322)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_10:01:01
  host      : host
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 4321)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4321
============================================================
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("keeps")
    (root / "eval.txt").write_text(TEXT)
    return root, save_small_artifact(root / "artifact")


def argv(workspace, out, *more) -> list[str]:
    root, artifact = workspace
    return ["--checkpoint", artifact, "--eval-text", str(root / "eval.txt"), "--new-tokens", "4", "--repeats", "1",
            "--block-size", "16", "--train-steps", "1", "--device", "cpu", "--out", str(out), *more]


def fake_training(fail_batches=(), calls=None):
    """run_train as the scorecard calls it, without a process: a run that logged two windows of tokens/s, or for a
    micro-batch in `fail_batches` the torchrun job whose rank 0 the OOM killer ended."""
    def run(out_dir, config, nproc=None, threads=None, timeout_s=None):
        if calls is not None:
            calls.append(config.batch_size)
        if config.batch_size in fail_batches:
            return TrainRun(["torchrun", "train.py"], 1, 2.0, [], OOM_KILLED)
        records = [{"step": 1, "tokens_per_s": 100.0 * config.batch_size, "peak_memory_bytes": 10**8},
                   {"step": 2, "tokens_per_s": 110.0 * config.batch_size, "peak_memory_bytes": 10**8}]
        return TrainRun(["train.py", f"--batch-size={config.batch_size}"], 0, 2.0, records, "")
    return run


def test_a_killed_training_run_keeps_the_figures_before_it_and_names_its_cause_in_one_line(workspace, monkeypatch,
                                                                                            tmp_path):
    out = tmp_path / "score.json"
    monkeypatch.setattr(scorecard, "run_train", fake_training(fail_batches=(12,)))
    with pytest.raises(SystemExit) as ended:
        leaderboard.main(argv(workspace, out))
    line = ended.value.code
    assert line == (f"error: train.py failed for micro-batch 12: rank 0 killed by SIGKILL (signal 9): likely out of "
                    f"memory (the kernel OOM killer sends SIGKILL; see dmesg); the figures measured so far are in "
                    f"{out} (`--resume` measures the rest)")
    score = json.loads(out.read_text())
    assert not score["complete"]
    for key in ("loss", "inference_latency_1", "inference_latency_12", "training_throughput_4"):
        assert score["status"][key]["status"] == "measured" and score[key] > 0, key
    assert score["training_throughput_4"] == pytest.approx(440.0)  # the median of its timed window
    failed = score["status"]["training_throughput_12"]
    assert failed["status"] == "failed" and failed["cause"].startswith("rank 0 killed by SIGKILL")
    assert score["training_throughput_12"] is None


def test_resume_measures_only_the_missing_figures_and_completes_the_file(workspace, monkeypatch, tmp_path):
    out = tmp_path / "score.json"
    monkeypatch.setattr(scorecard, "run_train", fake_training(fail_batches=(12,)))
    with pytest.raises(SystemExit):
        leaderboard.main(argv(workspace, out))
    before = json.loads(out.read_text())
    calls = []
    monkeypatch.setattr(scorecard, "run_train", fake_training(calls=calls))
    monkeypatch.setattr(scorecard, "validation_loss", lambda *a, **k: pytest.fail("measured the kept loss again"))
    monkeypatch.setattr(scorecard, "generation_figures", lambda *a, **k: pytest.fail("measured generation again"))
    score = leaderboard.main(argv(workspace, out, "--resume"))
    assert calls == [12] and score["complete"]
    assert json.loads(out.read_text()) == score
    for key in ("loss", "inference_latency_1", "inference_latency_12", "training_throughput_4"):
        assert score[key] == before[key] and score["measurements"][key] == before["measurements"][key]
        assert score["status"][key]["when"] == "kept from the file --resume finished"
    assert score["training_throughput_12"] == pytest.approx(12 * 110.0)
    assert score["status"]["training_throughput_12"] == {"status": "measured", "when": "this run"}
    assert set(score["spread"]) >= {"training_throughput_12", "inference_latency_1"}


def test_only_measures_the_keys_it_names_and_says_why_the_others_are_not_measured(workspace, monkeypatch, tmp_path):
    out = tmp_path / "score.json"
    calls = []
    monkeypatch.setattr(scorecard, "run_train", fake_training(calls=calls))
    score = leaderboard.main(argv(workspace, out, "--only", "training_throughput_4,loss"))
    assert calls == [4] and score["loss"] > 0 and score["training_throughput_4"] > 0 and not score["complete"]
    assert score["status"]["inference_latency_1"] == {"status": "not measured", "why": "not asked for (--only)"}
    assert score["inference_latency_1"] is None and score["time_to_first_token_s"] is None
    # --resume --only finishes just the figure it names
    score = leaderboard.main(argv(workspace, out, "--resume", "--only", "inference_latency_1"))
    assert score["inference_latency_1"] > 0 and score["inference_latency_12"] is None and calls == [4]


def test_resume_refuses_a_file_it_cannot_finish_in_one_line(workspace, monkeypatch, tmp_path):
    out = tmp_path / "score.json"
    monkeypatch.setattr(scorecard, "run_train", fake_training())
    with pytest.raises(SystemExit, match=r"^error: --resume: there is no scorecard at .*score.json to finish; run "
                                         r"without --resume$"):
        leaderboard.main(argv(workspace, out, "--resume"))
    leaderboard.main(argv(workspace, out, "--only", "loss"))
    with pytest.raises(SystemExit, match=r"^error: --resume: .*score.json was measured with 'repeats' = 1, not 2; "
                                         r"resume with its settings, or measure into another --out$"):
        leaderboard.main(argv(workspace, out, "--resume", "--repeats", "2"))
    with pytest.raises(SystemExit, match=r"^error: --resume finishes the scorecard at --out; give --out$"):
        leaderboard.main(argv(workspace, out)[:-2] + ["--resume"])
    with pytest.raises(SystemExit, match=r"^error: --only 'loss,speed': unknown key 'speed'; give one or more of "
                                         r"loss, inference_latency_1, .*separated by commas$"):
        leaderboard.main(argv(workspace, out, "--only", "loss,speed"))


def test_a_failure_names_train_pys_own_error_line_before_any_signal():
    own = "step 1/2: loss 10.7\nerror: --batch-size 3 does not divide over 2 ranks\n" + OOM_KILLED
    assert TrainRun([], 1, 3.0, [], own).failure() == "exit code 1: error: --batch-size 3 does not divide over 2 ranks"
    assert TrainRun([], -9, 3.0, [], "step 1/2\n").failure().startswith("train.py killed by SIGKILL (signal 9): "
                                                                        "likely out of memory")
    assert TrainRun([], 1, 3.0, [], OOM_KILLED).out_of_memory


def test_a_rank_killed_under_torchrun_is_read_from_torchruns_own_report(tmp_path):
    """A real torchrun job whose one rank a SIGKILL ends, as the OOM killer's would."""
    script = tmp_path / "killed.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    done = run_command([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                        str(script)], stderr=subprocess.STDOUT, timeout_s=120)
    run = TrainRun(["torchrun"], done.returncode, done.seconds, [], done.stdout[-3000:])
    assert run.failure().startswith("rank 0 killed by SIGKILL (signal 9): likely out of memory"), done.stdout

