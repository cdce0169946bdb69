"""storage/claim.py on its own: how an output folder stands to the folder a tool reads (under any name), what a
claim refuses or removes, and which new folders a refused start takes back -- each answer exact, so that a changed
comparison or a dropped case is seen here."""
from __future__ import annotations

import os

import pytest

from runtime.provenance import provenance
from storage.artifact import WEIGHTS_FILE, save_artifact
from storage.claim import (LOCK_FILES, claim_output_folder, folder_identity, lineage, missing_folders, overlap,
                           refuse_output_in_dataset, refuse_overlap, remove_unused_folders)
from storage.folder import release_writer_lock
from storage.meta import CONFIG_FILE
from storage.weights import ArtifactError


@pytest.fixture
def tree(tmp_path):
    """source/inside/deeper, a sibling folder, and a link to the source."""
    (tmp_path / "source" / "inside" / "deeper").mkdir(parents=True)
    (tmp_path / "apart").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "source")
    return tmp_path


def test_the_identity_of_a_folder_is_the_same_under_every_name_and_none_where_nothing_is(tree):
    assert folder_identity(tree / "source") == folder_identity(tree / "alias") == folder_identity(
        tree / "source" / "inside" / "..")
    assert folder_identity(tree / "missing") is None
    assert lineage(tree / "source" / "inside")[:2] == [folder_identity(tree / "source" / "inside"),
                                                       folder_identity(tree / "source")]
    assert lineage(tree / "source" / "new" / "deep")[0] == folder_identity(tree / "source")  # from where it would be made


@pytest.mark.parametrize("output, relation", [
    ("source", "is"), ("alias", "is"), ("source/inside", "inside"), ("alias/inside/deeper", "inside"),
    ("source/not-yet/made", "inside"), ("apart", None), ("apart/new", None), (".", "contains"), ("source/..", "contains")])
def test_an_output_folder_is_the_source_inside_it_above_it_or_apart(tree, output, relation):
    assert overlap(tree / "source", tree / output) == relation
    assert overlap(tree / "missing", tree / output) is None  # a hub name: nothing of it on disk to harm


def test_each_overlap_is_refused_with_its_reason_and_the_fix(tree):
    reasons = {"source": "is the source .*: writing there would replace the model being read",
               "source/inside": "is inside the source .*: writing there would add files to the folder being read",
               ".": "holds the source .*: --overwrite there may remove files of the folder being read"}
    for output, reason in reasons.items():
        with pytest.raises(ArtifactError, match=f"^the output folder .* {reason}; give --out-dir another folder$"):
            refuse_overlap(tree / "source", tree / output, "--out-dir")
        with pytest.raises(ArtifactError, match=f"{reason}; choose another output folder$"):
            refuse_overlap(tree / "source", tree / output, None)
    refuse_overlap(tree / "source", tree / "apart", "--out-dir")  # apart: no error


def test_only_an_output_in_the_dataset_or_being_it_is_refused_for_a_dataset(tree):
    for output, words in (("source", "is"), ("alias/new", "is inside")):
        with pytest.raises(ArtifactError, match=f"^the output folder {tree / output} {words} the dataset folder "):
            refuse_output_in_dataset(tree / "source", tree / output, "--out-dir")
    refuse_output_in_dataset(tree / "source", tree, "--out-dir")  # above the dataset: its files stay apart
    refuse_output_in_dataset(tree / "source", tree / "apart", "--out-dir")


def test_missing_folders_are_the_ones_a_claim_would_make_innermost_first(tree):
    assert missing_folders(tree / "apart" / "a" / "b") == [tree / "apart" / "a" / "b", tree / "apart" / "a"]
    assert missing_folders(tree / "apart") == []


def test_a_refused_start_takes_back_only_the_folders_it_made_and_only_while_they_hold_nothing_else(tree):
    made = missing_folders(tree / "apart" / "a" / "b")
    claim_output_folder(tree / "apart" / "a" / "b", "tests", overwrite=False)
    assert set(LOCK_FILES) <= set(os.listdir(tree / "apart" / "a" / "b"))
    release_writer_lock(tree / "apart" / "a" / "b")
    remove_unused_folders(made)
    assert os.listdir(tree / "apart") == []
    made = missing_folders(tree / "apart" / "c")
    claim_output_folder(tree / "apart" / "c", "tests", overwrite=False)
    release_writer_lock(tree / "apart" / "c")
    (tree / "apart" / "c" / "kept.txt").write_text("written by something else")
    remove_unused_folders(made)
    assert os.listdir(tree / "apart" / "c") and "kept.txt" in os.listdir(tree / "apart" / "c")
    remove_unused_folders([])  # nothing made: nothing to do
    remove_unused_folders([tree / "never-made"])


def test_a_claim_keeps_its_own_artifact_refuses_another_and_overwrite_removes_either(small_model, tmp_path):
    folder = tmp_path / "out"
    save_artifact(folder, small_model, small_model.config, "float", provenance("quantize"))
    with pytest.raises(ArtifactError, match=r"out already holds a float .* written by quantize; pass --overwrite to "
                                            r"replace it, or choose another output folder$"):
        claim_output_folder(folder, "prune", overwrite=False)
    release_writer_lock(folder)
    claim_output_folder(folder, "quantize", overwrite=False)
    release_writer_lock(folder)
    assert (folder / WEIGHTS_FILE).exists()
    (folder / CONFIG_FILE).write_text("{ damaged")
    with pytest.raises(ArtifactError, match=r"already holds a damaged artifact \("):
        claim_output_folder(folder, "quantize", overwrite=False)
    release_writer_lock(folder)
    claim_output_folder(folder, "prune", overwrite=True)
    release_writer_lock(folder)
    assert not (folder / WEIGHTS_FILE).exists() and not (folder / CONFIG_FILE).exists()
