"""The artifact folder protocol (storage/folder.py): one writer, readers that change nothing, saves that are
all or nothing even while other processes read."""
import json
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import train
from quantize.dynamic import main as quantize_main
from runtime.provenance import provenance
from storage.artifact import STAGING_DIR, load_model, read_meta, save_artifact
from storage.folder import (FILE_MODE, DiskFull, FolderBusy, acquire_writer_lock, holds_writer_lock, reading,
                          release_writer_lock, write_folder_atomically)
from tests.conftest import interrupt_training_at_batch, save_small_artifact
from tests.test_train import FAST, losses
from train import TrainConfig

HOLD_LOCK = textwrap.dedent("""
    import sys, time
    from storage.folder import acquire_writer_lock
    acquire_writer_lock(sys.argv[1])
    print("locked", flush=True)
    time.sleep(120)
""")


@pytest.fixture
def other_writer():
    """Start another process that holds a folder's writer lock; yields a function taking the folder."""
    processes = []

    def hold(folder):
        process = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(folder)], stdout=subprocess.PIPE, text=True)
        assert process.stdout.readline().strip() == "locked"
        processes.append(process)
        return process

    yield hold
    for process in processes:
        process.kill()
        process.wait()


def staged_save(folder, journal: bool) -> None:
    """What a writer leaves while staging: a file in .staging/, with or without the journal."""
    staging = folder / STAGING_DIR
    staging.mkdir()
    (staging / "extra.txt").write_text("new")
    if journal:
        (staging / "COMPLETE").write_text(json.dumps(["extra.txt"]))


@pytest.mark.parametrize("journal", [False, True])
def test_a_reader_never_touches_a_live_writers_staging(tmp_path, small_model, other_writer, journal):
    folder = tmp_path / "ckpt"
    save_artifact(folder, small_model, small_model.config, "float", provenance("tests"))
    other_writer(folder)
    staged_save(folder, journal)
    read_meta(folder)
    load_model(folder)
    assert (folder / STAGING_DIR / "extra.txt").read_text() == "new"
    assert not (folder / "extra.txt").exists()


def test_a_reader_finishes_a_save_whose_writer_is_gone(tmp_path, small_model):
    folder = tmp_path / "ckpt"
    save_artifact(folder, small_model, small_model.config, "float", provenance("tests"))
    staged_save(folder, journal=True)
    read_meta(folder)
    assert (folder / "extra.txt").read_text() == "new" and not (folder / STAGING_DIR).exists()
    assert not holds_writer_lock(folder)  # it stood in for the writer only while finishing


def test_an_incomplete_or_cut_journal_is_discarded_by_the_next_writer(tmp_path, small_model):
    folder = tmp_path / "ckpt"
    save_artifact(folder, small_model, small_model.config, "float", provenance("tests"))
    staged_save(folder, journal=True)
    (folder / STAGING_DIR / "COMPLETE").write_text("")  # killed while writing the journal
    assert read_meta(folder).kind == "float"  # readers are not blocked by it
    save_artifact(folder, small_model, small_model.config, "float", provenance("tests"))
    assert not (folder / STAGING_DIR).exists() and not (folder / "extra.txt").exists()


def test_a_second_writer_is_refused_with_the_first_ones_name(tmp_path, other_writer):
    folder = tmp_path / "run"
    first = other_writer(folder)
    with pytest.raises(FolderBusy, match=rf"{folder} is being written by process {first.pid} on .*\(`python -c "):
        acquire_writer_lock(folder)
    with pytest.raises(SystemExit) as exit_info:  # train.py's main: one error line, no traceback
        train.main([*FAST_FLAGS, "--max-steps", "1", "--out-dir", str(folder)])
    assert str(exit_info.value.code).startswith(f"error: {folder} is being written by process {first.pid}")


def test_the_writer_lock_dies_with_its_process(tmp_path, other_writer):
    folder = tmp_path / "run"
    holder = other_writer(folder)
    holder.kill()
    holder.wait()
    acquire_writer_lock(folder)  # kill -9 leaves no stale lock
    release_writer_lock(folder)


FAST_FLAGS = ["--model", "tiny", "--dataset", "builtin", "--device", "cpu", "--batch-size", "4", "--block-size", "64",
              "--no-curves"]



def test_training_that_saves_every_step_is_undisturbed_by_a_reader_in_a_tight_loop(tmp_path, monkeypatch):
    out, stop = tmp_path / "run", tmp_path / "stop"
    reader = subprocess.Popen([sys.executable, "-m", "bench.workloads.checkpoint_reader", str(out), str(stop)],
                              stdout=subprocess.PIPE, text=True)
    undo = interrupt_training_at_batch(monkeypatch, 7)  # Ctrl-C after 6 saves
    try:
        with pytest.raises(SystemExit):
            train.train(TrainConfig(**FAST, max_steps=8, eval_interval=100, checkpoint_interval=1, out_dir=str(out)))
    finally:
        undo()
        stop.touch()
        report = json.loads(reader.communicate(timeout=60)[0])
    assert report["errors"] == [] and report["reads"] >= 2
    assert json.loads((out / "training_state" / "state.json").read_text())["step"] == 6
    assert not (out / STAGING_DIR).exists()
    # Resuming what the reader read equals an uninterrupted run.
    train.train(TrainConfig(**FAST, max_steps=8, eval_interval=100, checkpoint_interval=1, out_dir=str(out),
                            resume="yes"))
    full = tmp_path / "full"
    train.train(TrainConfig(**FAST, max_steps=8, eval_interval=100, checkpoint_interval=100, out_dir=str(full)))
    assert losses(out)[8] == pytest.approx(losses(full)[8], rel=1e-6, abs=0)
    resumed, uninterrupted = load_model(out)[0], load_model(full)[0]
    assert all(torch.equal(a, b) for a, b in zip(resumed.state_dict().values(), uninterrupted.state_dict().values()))


def test_a_tool_refuses_another_tools_artifact_unless_told_to_overwrite(tmp_path, small_model, capsys):
    run = tmp_path / "run"
    save_artifact(run, small_model, small_model.config, "float", provenance("train.py"))
    write_folder_atomically(run, {"training_state/state.json": lambda p: p.write_text("{}")})
    source = save_small_artifact(tmp_path / "source")
    quantize = ["--checkpoint", source, "--out-dir", str(run), "--eval-batches", "1", "--repeats", "1",
                "--new-tokens", "1", "--prompt-tokens", "4"]
    with pytest.raises(SystemExit, match=rf"error: {run} already holds a float artifact written by train.py; pass "
                                         r"--overwrite"):
        quantize_main(quantize)
    assert read_meta(run).kind == "float" and (run / "training_state/state.json").exists()

    quantize_main([*quantize, "--overwrite"])
    assert read_meta(run).kind == "int8" and not (run / "training_state").exists()
    assert {p.name for p in run.iterdir() if not p.name.startswith(".")} == {"config.json", "model.safetensors",
                                                                             "quant_report.json"}
    with pytest.raises(SystemExit, match=r"already holds an int8 artifact written by quantize/dynamic.py"):
        train.main([*FAST_FLAGS, "--max-steps", "1", "--out-dir", str(run)])


def test_a_nested_read_does_not_wait_behind_a_waiting_writer(tmp_path, small_model):
    """A writer queued at the gate waits for the outer read; the inner read of the same thread goes ahead
    instead of queueing behind it (which would deadlock both)."""
    folder = tmp_path / "ckpt"
    save_artifact(folder, small_model, small_model.config, "float", provenance("tests"))
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import dataclasses
        import sys
        from storage.artifact import load_model, save_artifact
        model, meta = load_model(sys.argv[1])
        save_artifact(sys.argv[1], model, model.config, "float", dataclasses.asdict(meta.produced_by))
    """), str(folder)])
    with reading(folder):
        deadline = time.monotonic() + 60
        while not (folder / STAGING_DIR / "COMPLETE").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the writer has staged its save and waits at the gate to move it in
        assert writer.poll() is None and (folder / STAGING_DIR / "COMPLETE").exists()
        load_model(folder)
    assert writer.wait(timeout=60) == 0


def hostile_folder(tmp_path, small_model, entry: str):
    """A victim folder beside an artifact whose `.contents` lists `entry`."""
    victim = tmp_path / "victim"
    victim.mkdir(exist_ok=True)
    (victim / "precious.txt").write_text("keep me")
    folder = tmp_path / "ck"
    save_artifact(folder, small_model, small_model.config, "float", provenance("train.py"))
    (folder / ".contents").write_text(json.dumps(["config.json", entry]))
    return folder, victim


def escaping_entries(tmp_path) -> list[str]:
    (tmp_path / "ck_link_target").mkdir(exist_ok=True)
    return ["../victim", str(tmp_path / "victim"), "inner/../../victim", "link/precious.txt"]


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "hidden dotdot", "symlink"])
def test_contents_naming_a_place_outside_the_folder_deletes_nothing(tmp_path, small_model, kind):
    entry = dict(zip(["dotdot", "absolute", "hidden dotdot", "symlink"], escaping_entries(tmp_path)))[kind]
    folder, victim = hostile_folder(tmp_path, small_model, entry)
    (folder / "link").symlink_to(victim)
    source = save_small_artifact(tmp_path / "source")
    with pytest.raises(SystemExit) as exit_info:
        quantize_main(["--checkpoint", source, "--out-dir", str(folder), "--overwrite", "--eval-batches", "1",
                       "--repeats", "1", "--new-tokens", "1", "--prompt-tokens", "4"])
    message = str(exit_info.value.code)
    assert message.startswith(f"error: {folder / '.contents'} lists {entry!r}, which is not a file inside")
    assert (victim / "precious.txt").read_text() == "keep me"
    assert read_meta(folder).kind == "float"  # the folder itself is untouched too


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "hidden dotdot", "symlink"])
def test_a_journal_naming_a_place_outside_the_folder_moves_nothing(tmp_path, small_model, kind):
    entry = dict(zip(["dotdot", "absolute", "hidden dotdot", "symlink"], escaping_entries(tmp_path)))[kind]
    folder, victim = hostile_folder(tmp_path, small_model, "config.json")
    (folder / "link").symlink_to(victim)
    staging = folder / STAGING_DIR
    staging.mkdir()
    (staging / "link").symlink_to(victim)
    (tmp_path / "moved.txt").write_text("stay")
    (staging / "COMPLETE").write_text(json.dumps(["config.json", entry, "../../moved.txt"]))
    with pytest.raises(SystemExit) as exit_info:  # a mere reader finishes interrupted saves
        import sample
        sample.main(["--checkpoint", str(folder), "--prompt", "x", "--max-new-tokens", "1"])
    assert f"{staging / 'COMPLETE'} lists {entry!r}" in str(exit_info.value.code)
    assert (victim / "precious.txt").read_text() == "keep me" and (tmp_path / "moved.txt").read_text() == "stay"
    assert json.loads((folder / ".contents").read_text()) == ["config.json", "config.json"]
    assert not holds_writer_lock(folder)


def test_a_full_disk_during_a_save_is_one_error_and_keeps_the_previous_save(tmp_path, small_model):
    folder = tmp_path / "ck"
    save_artifact(folder, small_model, small_model.config, "float", provenance("tests"))

    def write_to_full_disk(path):  # what torch.save does when the disk fills: /dev/full always answers ENOSPC
        with open("/dev/full", "wb") as f:
            torch.save({"w": torch.zeros(100_000)}, f)

    with pytest.raises(DiskFull, match=rf"the disk holding {folder} is full \(ENOSPC\); this save was discarded"):
        write_folder_atomically(folder, {"config.json": lambda p: p.write_text("{}"), "opt.pt": write_to_full_disk})
    assert read_meta(folder).kind == "float" and not (folder / STAGING_DIR).exists()


def test_training_on_a_full_disk_names_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    from training.checkpoint import checkpointer
    real_save, saves = checkpointer.save_through_python, []

    def fill_the_disk_on_the_second_save(obj, path):
        saves.append(path)
        real_save(obj, "/dev/full" if len(saves) == 2 else path)

    monkeypatch.setattr(checkpointer, "save_through_python", fill_the_disk_on_the_second_save)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        train.main([*FAST_FLAGS, "--max-steps", "4", "--checkpoint-interval", "2", "--eval-interval", "100",
                    "--final-eval-batches", "1", "--log-interval", "100", "--out-dir", str(out)])
    assert exit_info.value.code == (f"error: step 4: the disk holding {out} is full (ENOSPC); this save was "
                                    f"discarded and the folder keeps its previous save. Free some space and run "
                                    f"again. Last good: the checkpoint of step 2 in {out}, which is intact")
    assert json.loads((out / "training_state" / "state.json").read_text())["step"] == 2
    assert "Traceback" not in capsys.readouterr().err


def test_saved_files_are_readable_as_the_umask_allows(tmp_path, small_model):
    folder = tmp_path / "ck"
    save_artifact(folder, small_model, small_model.config, "float", provenance("tests"))
    for name in ("model.safetensors", "config.json"):
        assert (folder / name).stat().st_mode & 0o777 == FILE_MODE
    assert FILE_MODE & 0o044  # group and others may read under the usual umask 022
