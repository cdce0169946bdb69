"""bench/demo.py, the stages of `make demo` and `make smoke`: a stage is skipped only when the artifact loader reads
its output whole and finished, and a demo stopped after a stage continues from the next."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from bench import demo
from model.gpt import GPT
from runtime.provenance import provenance
from storage.artifact import artifact_writers, model_state_for_saving, write_folder_atomically
from tests.conftest import small_config
from tests.hostile import attempt, file_digests, unchanged
from tests.source_tree import ROOT


def saved_training_step(folder: Path, step: int) -> None:
    torch.manual_seed(0)
    model = GPT(small_config(n_layer=1, n_head=2, n_embd=16, block_size=32))
    write_folder_atomically(folder, artifact_writers(model_state_for_saving(model), model.config, "float",
                                                     provenance("train.py"), extra={"step": step}))


def test_a_training_stage_is_done_only_when_its_checkpoint_loads_whole_at_the_last_step(tmp_path, capsys):
    folder = tmp_path / "train"
    assert not demo.finished_training(folder, 10)()  # nothing there
    saved_training_step(folder, 5)
    assert not demo.finished_training(folder, 10)()  # stopped midway: the stage runs (and resumes)
    saved_training_step(folder, 10)
    assert demo.finished_training(folder, 10)()
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # damaged: not done, whatever it says
    assert not demo.finished_training(folder, 10)()
    assert "running the stage again" in capsys.readouterr().err


def test_a_text_stage_is_done_only_once_its_output_was_renamed_into_place(tmp_path):
    output = tmp_path / "sample.txt"
    stage = demo.Stage("sample", "says hello", [sys.executable, "-c", "print('hello')"], demo.text_written(output),
                       output=output)
    assert not stage.done()
    demo.run_stage(stage)
    assert stage.done() and output.read_text() == "hello\n"
    assert not list(tmp_path.glob(".*partial"))


def test_the_scorecard_stage_is_done_only_when_its_scorecard_is_complete(tmp_path):
    """The scorecard writes each figure as it is measured: a run that failed midway leaves a file that is not done."""
    path = tmp_path / "scorecard.json"
    done = demo.finished_scorecard(path)
    assert not done()
    path.write_text(json.dumps({"loss": 9.3, "complete": False, "status": {"loss": {"status": "measured"}}}))
    assert not done()
    path.write_text(json.dumps({"loss": 9.3, "complete": True}))
    assert done()
    path.write_text('{"loss": 9.3, "compl')  # not JSON
    assert not done()


def test_an_out_dir_that_cannot_be_a_folder_or_a_record_over_finished_stages_is_one_error_line(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    for out in (tmp_path / "file", tmp_path / "file" / "below"):
        assert attempt("demo", lambda: demo.main(["--sizes", "smoke", "--out-dir", str(out)])) == "refused"
    saved_training_step(tmp_path / "smoke" / "train", demo.SIZES["smoke"].train_steps)  # stage 1 finished
    with unchanged("demo", tmp_path / "smoke"):
        assert attempt("demo", lambda: demo.main(["--sizes", "smoke", "--out-dir", str(tmp_path / "smoke"),
                                                  "--record"])) == "refused"


def test_a_demo_stopped_after_its_first_stage_continues_and_skips_it(tmp_path):
    out = tmp_path / "smoke"
    command = [sys.executable, "-m", "bench.demo", "--sizes", "smoke", "--out-dir", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}

    def run_until(line_start: str) -> tuple[list[str], str, int]:
        """Start the demo, send SIGTERM once it prints a line starting with `line_start`; its lines, stderr and
        exit status."""
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        lines = []
        try:
            for line in process.stdout:
                lines.append(line.rstrip("\n"))
                if line.startswith(line_start):
                    process.send_signal(signal.SIGTERM)
                    break
            _, stderr = process.communicate(timeout=300)
        finally:
            process.kill()
        return lines, stderr, process.returncode

    lines, stderr, status = run_until("== stage 1/8 train took")
    assert status == 143, stderr
    assert stderr.strip().splitlines()[-1].startswith("stopped by SIGTERM "), stderr
    assert "Traceback" not in stderr
    trained = {name: file_digests(out / "train" / name) for name in ("model.safetensors", "config.json")}

    lines, stderr, status = run_until("== stage 2/8")  # the second run: stopped again once it goes past stage 1
    assert lines[0].startswith("== stage 1/8 train: ") and lines[0].endswith("done already (its output is complete "
                                                                             "and valid), skipped"), lines
    assert status == 143 and "Traceback" not in stderr, stderr
    assert {name: file_digests(out / "train" / name) for name in trained} == trained  # not trained again
