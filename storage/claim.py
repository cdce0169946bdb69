"""Claiming an output folder: the one place a tool becomes a folder's writer, and the one place `--overwrite`
deletes anything; and undoing the claim of a new folder when the tool then refuses to start."""
from __future__ import annotations

import os
from pathlib import Path

from storage.artifact import WEIGHTS_FILE
from runtime.errors import UserError
from storage.folder import (GATE_LOCK, SWAP_LOCK, WRITER_LOCK, acquire_writer_lock, previous_contents,
                            release_writer_lock, remove_files)
from storage.meta import CONFIG_FILE, ArtifactMeta
from storage.weights import ArtifactError

# What claiming a folder writes into it before the tool has written anything of its own.
LOCK_FILES = (WRITER_LOCK, SWAP_LOCK, GATE_LOCK)

# The tool that writes Hugging Face folders (storage/export.py), which record no producer of ours.
EXPORT_TOOL = "storage.export"


def folder_identity(path: str | Path) -> tuple[int, int] | None:
    """The folder itself, as the kernel knows it (device and inode): equal for every name it has -- a symlink,
    `..`, a bind mount.  None when nothing exists there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def lineage(path: str | Path) -> list[tuple[int, int]]:
    """The identities of `path` and of every folder above it, nearest first (a path that does not exist yet
    starts at its nearest existing ancestor: that is where it would be created)."""
    real = Path(os.path.realpath(path))  # symlinks resolved, so each parent is the physical one
    return [identity for p in (real, *real.parents) if (identity := folder_identity(p)) is not None]


def overlap(source: str | Path, output: str | Path) -> str | None:
    """How an output folder overlaps the folder a tool reads: "is" (the same folder under any name), "inside"
    (somewhere in its tree) or "contains" (a folder above it); None when they are apart."""
    source_id, output_id = folder_identity(source), folder_identity(output)
    if source_id is None:  # a hub name, or a folder that is not there: nothing of it can be overwritten
        return None
    if output_id == source_id:
        return "is"
    if source_id in lineage(output):
        return "inside"
    if output_id is not None and output_id in lineage(source):
        return "contains"
    return None


# How each overlap would alter the source, and how the output folder stands to it.
OVERLAPS = {"is": ("is the source", "writing there would replace the model being read"),
            "inside": ("is inside the source", "writing there would add files to the folder being read"),
            "contains": ("holds the source", "--overwrite there may remove files of the folder being read")}


def refuse_overlap(source: str | Path, folder: Path, out_flag: str | None) -> None:
    relation = overlap(source, folder)
    if relation is None:
        return
    where, why = OVERLAPS[relation]
    fix = f"give {out_flag} another folder" if out_flag else "choose another output folder"
    raise ArtifactError(f"the output folder {folder} {where} {source}: {why}; {fix}")


def refuse_output_in_dataset(dataset: str | Path, output: str | Path, out_flag: str) -> None:
    """Refuse an output folder that is the local dataset folder `dataset`, or lies anywhere inside it under any
    name: what a run writes there (metrics.jsonl, checkpoints) would be read as text by its next start.  Called
    before anything is written."""
    relation = overlap(dataset, output)
    if relation in ("is", "inside"):
        raise ArtifactError(f"the output folder {output} {'is' if relation == 'is' else 'is inside'} the dataset "
                            f"folder {dataset}: what the run writes (metrics.jsonl, checkpoints) would be read as "
                            f"training text; give {out_flag} a folder outside it")


def claim_output_folder(folder: str | Path, tool: str, overwrite: bool, source: str | Path | None = None,
                        out_flag: str | None = None) -> None:
    """Make this process the folder's one writer, for `tool`'s artifact.  The folder a tool reads from
    (`source`) is refused as its output, as is any folder inside it or above it, however either is named.
    A tool loads its source before it claims its output, so that a source it cannot load never costs the
    output folder its artifact.  A folder holding another tool's artifact (or something unreadable) is refused unless
    `overwrite`; with `overwrite` the folder's artifact files are removed first, whoever wrote them, so one
    folder never mixes two artifacts (int8 weights beside a training run's optimizer state).  `out_flag`: the
    tool's option that names the folder, for the messages."""
    folder = Path(folder)
    if source is not None:
        refuse_overlap(source, folder, out_flag)
    acquire_writer_lock(folder)
    if not (folder / CONFIG_FILE).exists():
        return
    try:
        meta = ArtifactMeta.read(folder)
        owner = "a Hugging Face model" if meta.is_hugging_face else \
            f"{meta.described} written by {meta.produced_by.tool}"
        ours = meta.produced_by.tool == tool or (meta.is_hugging_face and tool == EXPORT_TOOL)
    except ArtifactError as e:
        owner, ours = f"a damaged artifact ({e})", False
    if not ours and not overwrite:
        raise ArtifactError(f"{folder} already holds {owner}; pass --overwrite to replace it, or choose another "
                            f"output folder")
    if overwrite:
        remove_files(folder, previous_contents(folder) or [CONFIG_FILE, WEIGHTS_FILE])


def missing_folders(folder: str | Path) -> list[Path]:
    """The folders that claiming `folder` would create: it and those above it that are not there, innermost
    first.  Taken before the claim, so that `remove_unused_folders` knows which are new."""
    folder = Path(folder)
    return [path for path in (folder, *folder.parents) if not os.path.lexists(path)]


def remove_unused_folders(created: list[Path]) -> None:
    """Undo a claim for a tool that refused to start: the folders of `created` (`missing_folders`, taken before
    the claim) go again while they hold nothing but the claim's lock files, so a refused start leaves no new
    folder behind.  The lock files are removed under the writer lock, so a process that has claimed the folder
    since keeps it."""
    if not created or not os.path.isdir(created[0]):  # never created: the start was refused before the claim
        return
    folder = created[0]
    try:
        acquire_writer_lock(folder)
    except UserError:  # another process writes it now: the folder is in use
        return
    try:
        if set(os.listdir(folder)) - set(LOCK_FILES):
            return
        for name in LOCK_FILES:
            (folder / name).unlink(missing_ok=True)
    except OSError:  # left as it is: the error that refused the start is the one to report
        return
    finally:
        release_writer_lock(folder)
    for path in created:
        try:
            path.rmdir()
        except OSError:  # something else is in it now
            return
