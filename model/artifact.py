"""The one artifact format: a folder with `config.json` and `model.safetensors`.

Every tool reads and writes these folders through this module.  Writes go to a
staging folder first and are moved into place only once complete (a journal
that the next reader rolls forward), so a crash or Ctrl-C during a save leaves
the previous checkpoint readable.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from model.config import GPTConfig
from model.gpt import GPT
from model.hf import load_hf_gpt2
from model.hub import resolve_checkpoint
from model.int8 import build_int8_model
from model.weights import ArtifactError, load_weights, read_safetensors

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
STAGING_DIR = ".staging"
DEFAULT_OUT_ROOT = Path("out")
ARTIFACT_KINDS = ("float", "pruned", "int8")


def write_folder_atomically(folder: str | Path, writers: dict[str, Callable[[Path], None]]) -> None:
    """Write each relative path with its writer, all or nothing from a reader's point of view."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    staging = folder / STAGING_DIR
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for name, write in writers.items():
        path = staging / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
        with open(path, "rb") as f:
            os.fsync(f.fileno())
    journal = staging / "COMPLETE"
    journal.write_text(json.dumps(sorted(writers)))
    with open(journal, "rb") as f:
        os.fsync(f.fileno())
    roll_forward(folder)


def roll_forward(folder: str | Path) -> None:
    """Finish a save that completed staging but was interrupted while moving files; drop an incomplete one."""
    staging = Path(folder) / STAGING_DIR
    if not staging.exists():
        return
    journal = staging / "COMPLETE"
    if journal.exists():
        for name in json.loads(journal.read_text()):
            src = staging / name
            if src.exists():
                dst = Path(folder) / name
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)
    shutil.rmtree(staging, ignore_errors=True)


def model_state_for_saving(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights to store: the tied output head is stored once (as the embedding)."""
    state = {k.removeprefix("_orig_mod."): v for k, v in model.state_dict().items()}
    state.pop("lm_head.weight", None)
    return {k: v.detach().contiguous().cpu() for k, v in state.items()}


def artifact_writers(model_state: dict[str, torch.Tensor], config: GPTConfig, kind: str, produced_by: dict,
                     extra: dict | None = None) -> dict[str, Callable[[Path], None]]:
    if kind not in ARTIFACT_KINDS:
        raise ValueError(f"artifact kind {kind!r} is not one of {ARTIFACT_KINDS}")
    meta = {"artifact": kind, "model": config.to_dict(), "produced_by": produced_by, **(extra or {})}
    return {
        WEIGHTS_FILE: lambda p: save_file(model_state, str(p), metadata={"artifact": kind}),
        CONFIG_FILE: lambda p: p.write_text(json.dumps(meta, indent=2) + "\n"),
    }


def save_artifact(folder, model: torch.nn.Module, config: GPTConfig, kind: str, produced_by: dict,
                  extra: dict | None = None) -> None:
    write_folder_atomically(folder, artifact_writers(model_state_for_saving(model), config, kind,
                                                     produced_by, extra))


def read_config(folder: str | Path) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactError(f"checkpoint folder {folder} does not exist; train one with `python train.py` "
                            f"or pass --checkpoint DIR")
    roll_forward(folder)
    path = folder / CONFIG_FILE
    if not path.exists():
        raise ArtifactError(f"{folder} has no {CONFIG_FILE}: it is not a checkpoint folder")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{path} is not valid JSON ({e}); the checkpoint is damaged") from e


def load_model(folder: str | Path, device: str | torch.device = "cpu") -> tuple[torch.nn.Module, dict]:
    """Any artifact folder (float, pruned, int8, or a Hugging Face GPT-2 folder or hub name) as a ready model in
    eval mode."""
    folder = resolve_checkpoint(folder)
    meta = read_config(folder)
    if "model_type" in meta:  # a Hugging Face folder
        model = load_hf_gpt2(folder)
        meta = {"artifact": "float", "model": model.config.to_dict(), "produced_by": {"tool": "huggingface"}}
        return model.to(device).eval(), meta
    kind = meta.get("artifact")
    if kind not in ARTIFACT_KINDS:
        raise ArtifactError(f"{folder / CONFIG_FILE} names artifact kind {kind!r}; expected one of {ARTIFACT_KINDS}")
    config = GPTConfig.from_dict(meta["model"])
    state = read_safetensors(folder / WEIGHTS_FILE)
    if kind == "int8":
        model = build_int8_model(config, state, meta)
    else:
        with torch.device("meta"):
            model = GPT(config)
        load_weights(model, state)
    return model.to(device).eval(), meta


def artifact_folders(root: str | Path = DEFAULT_OUT_ROOT, accept: Callable[[dict], bool] | None = None) -> list[Path]:
    """Every artifact folder at or below `root` whose config.json satisfies `accept`.

    Folders whose config.json cannot be read are skipped here; naming one with --checkpoint reports the damage.
    """
    folders = []
    for path in Path(root).rglob(CONFIG_FILE):
        if STAGING_DIR in path.parts:
            continue
        if accept is not None:
            try:
                meta = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if not isinstance(meta, dict) or not accept(meta):
                continue
        folders.append(path.parent)
    return folders
