"""Claiming an output folder: the one place a tool becomes a folder's writer, and the one place `--overwrite`
deletes anything."""
from __future__ import annotations

import os
from pathlib import Path

from storage.artifact import WEIGHTS_FILE
from storage.folder import acquire_writer_lock, previous_contents, remove_files
from storage.meta import CONFIG_FILE, ArtifactMeta
from storage.weights import ArtifactError

# The tool that writes Hugging Face folders (storage/export.py), which record no producer of ours.
EXPORT_TOOL = "storage.export"


def same_folder(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one folder, however spelt (symlinks, `./`, a trailing slash)."""
    return os.path.realpath(a) == os.path.realpath(b)


def claim_output_folder(folder: str | Path, tool: str, overwrite: bool, source: str | Path | None = None,
                        out_flag: str | None = None) -> None:
    """Make this process the folder's one writer, for `tool`'s artifact.  The folder a tool reads from
    (`source`) is refused as its output: `--overwrite` would delete it before it is read, and a save would
    replace it.  A folder holding another tool's artifact (or something unreadable) is refused unless
    `overwrite`; with `overwrite` the folder's artifact files are removed first, whoever wrote them, so one
    folder never mixes two artifacts (int8 weights beside a training run's optimizer state).  `out_flag`: the
    tool's option that names the folder, for the messages."""
    folder = Path(folder)
    if source is not None and same_folder(source, folder):
        fix = f"give {out_flag} another folder" if out_flag else "choose another output folder"
        raise ArtifactError(f"the output folder {folder} is the source {source}: writing there would replace the "
                            f"model being read; {fix}")
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
