"""storage/claim.py at the edges test_claim.py leaves: a Hugging Face folder (ours only to the exporter), what
`--overwrite` removes where the folder records no contents, a refused overlap that leaves nothing behind, and the
taking back of new folders while another process writes them or a parent holds something else."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from storage.artifact import WEIGHTS_FILE
from storage.claim import (EXPORT_TOOL, LOCK_FILES, claim_output_folder, folder_identity, missing_folders,
                           remove_unused_folders)
from storage.folder import GATE_LOCK, SWAP_LOCK, WRITER_LOCK, holds_writer_lock, release_writer_lock
from storage.hf import config_to_hf
from storage.meta import CONFIG_FILE
from storage.weights import ArtifactError
from tests.conftest import small_config

HOLD_LOCK = textwrap.dedent("""
    import sys, time
    from storage.folder import acquire_writer_lock
    acquire_writer_lock(sys.argv[1])
    print("locked", flush=True)
    time.sleep(60)
""")


def test_the_claim_writes_the_three_lock_files():
    assert LOCK_FILES == (WRITER_LOCK, SWAP_LOCK, GATE_LOCK) and EXPORT_TOOL == "storage.export"


def hugging_face_folder(path):
    path.mkdir()
    (path / CONFIG_FILE).write_text(json.dumps(config_to_hf(small_config())))
    (path / WEIGHTS_FILE).write_bytes(b"weights")
    return path


def test_a_hugging_face_folder_is_the_exporters_own_and_another_tools_only_with_overwrite(tmp_path):
    folder = hugging_face_folder(tmp_path / "hf")
    with pytest.raises(ArtifactError) as refused:
        claim_output_folder(folder, "prune", overwrite=False)
    assert str(refused.value) == (f"{folder} already holds a Hugging Face model; pass --overwrite to replace it, or "
                                  f"choose another output folder")
    release_writer_lock(folder)
    claim_output_folder(folder, EXPORT_TOOL, overwrite=False)  # the exporter rewrites its own folder
    assert holds_writer_lock(folder) and (folder / WEIGHTS_FILE).exists()
    release_writer_lock(folder)
    claim_output_folder(folder, "prune", overwrite=True)  # no .contents: the config and the weights go
    release_writer_lock(folder)
    assert not (folder / CONFIG_FILE).exists() and not (folder / WEIGHTS_FILE).exists()


def test_overwrite_of_a_folder_that_is_already_ours_still_empties_it_first(tmp_path):
    folder = hugging_face_folder(tmp_path / "hf")
    (folder / "notes.txt").write_text("not part of the artifact")
    claim_output_folder(folder, EXPORT_TOOL, overwrite=True)
    release_writer_lock(folder)
    assert sorted(p.name for p in folder.iterdir() if p.name not in LOCK_FILES) == ["notes.txt"]


def test_a_folder_without_an_artifact_is_claimed_and_nothing_in_it_removed(tmp_path):
    (tmp_path / "new" / "kept.txt").parent.mkdir()
    (tmp_path / "new" / "kept.txt").write_text("x")
    claim_output_folder(tmp_path / "new", "prune", overwrite=True)
    release_writer_lock(tmp_path / "new")
    assert (tmp_path / "new" / "kept.txt").read_text() == "x"


def test_an_overlap_is_refused_before_the_output_folder_is_made(tmp_path):
    source = hugging_face_folder(tmp_path / "source")
    with pytest.raises(ArtifactError, match="is inside the source"):
        claim_output_folder(source / "new", "quantize", overwrite=False, source=source, out_flag="--out-dir")
    assert not (source / "new").exists() and not holds_writer_lock(source / "new")
    assert folder_identity(source / "missing") is None
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert folder_identity(tmp_path / "dangling") is None


def test_new_folders_are_taken_back_up_to_the_first_that_holds_something_else(tmp_path):
    made = missing_folders(tmp_path / "a" / "b" / "c")
    assert made == [tmp_path / "a" / "b" / "c", tmp_path / "a" / "b", tmp_path / "a"]
    claim_output_folder(tmp_path / "a" / "b" / "c", "prune", overwrite=False)
    release_writer_lock(tmp_path / "a" / "b" / "c")
    (tmp_path / "a" / "other.txt").write_text("something else, written meanwhile")
    remove_unused_folders(made)
    assert not (tmp_path / "a" / "b").exists() and (tmp_path / "a" / "other.txt").exists()


def test_new_folders_another_process_now_writes_are_left_to_it(tmp_path):
    made = missing_folders(tmp_path / "run")
    claim_output_folder(tmp_path / "run", "prune", overwrite=False)
    release_writer_lock(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path / "run")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        remove_unused_folders(made)
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(LOCK_FILES)
    finally:
        holder.kill()
        holder.wait()
    remove_unused_folders(made)  # its writer gone: the folder holds only the claim's files, and goes
    assert not (tmp_path / "run").exists()
