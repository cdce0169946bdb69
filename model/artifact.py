"""The one artifact format: a folder with `config.json` and `model.safetensors`.

Every tool reads and writes these folders through this module.  How a folder is
changed safely (staged saves, one writer, readers that never see half a save)
is model/folder.py; what is in it, and whether it is sound, is here.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from model.config import ConfigError, GPTConfig
from model.folder import (STAGING_DIR, acquire_writer_lock, previous_contents, reading, remove_files,
                          write_folder_atomically)
from model.gpt import GPT
from model.hf import load_hf_gpt2
from model.hub import resolve_checkpoint
from model.int8 import build_int8_model, int8_state_for_saving
from model.weights import ArtifactError, load_weights, read_safetensors

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
DEFAULT_OUT_ROOT = Path("out")
ARTIFACT_KINDS = ("float", "pruned", "int8")


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


def int8_artifact_writers(model: GPT, produced_by: dict, quantization: dict) -> dict[str, Callable[[Path], None]]:
    """`artifact_writers` for a model quantized by `model.int8.quantize_model`, which returned `quantization`."""
    return artifact_writers(int8_state_for_saving(model), model.config, "int8", produced_by,
                            extra={"quantization": quantization})


def save_artifact(folder, model: torch.nn.Module, config: GPTConfig, kind: str, produced_by: dict,
                  extra: dict | None = None) -> None:
    write_folder_atomically(folder, artifact_writers(model_state_for_saving(model), config, kind,
                                                     produced_by, extra))


def read_config(folder: str | Path) -> dict:
    """The folder's config.json as a dict (an artifact's or a Hugging Face folder's); one error line naming
    the file when it is missing or is not a JSON object."""
    folder = _existing(folder)
    with reading(folder):
        return _read_config(folder)


def _existing(folder: str | Path) -> Path:
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactError(f"checkpoint folder {folder} does not exist; train one with `python train.py` "
                            f"or pass --checkpoint DIR")
    return folder


def _read_config(folder: Path) -> dict:
    path = folder / CONFIG_FILE
    if not path.exists():
        raise ArtifactError(f"{folder} has no {CONFIG_FILE}: it is not a checkpoint folder")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path} is not valid JSON ({e}); the checkpoint is damaged") from e
    if not isinstance(meta, dict):
        kind = {"list": "list", "str": "string", "int": "number", "float": "number", "bool": "boolean"}.get(
            type(meta).__name__, "null")
        raise ArtifactError(f"{path} holds a JSON {kind}, not an object; the checkpoint is damaged")
    return meta


def model_config(meta: dict, path: Path) -> GPTConfig:
    """The model section of an artifact's config.json, checked field by field."""
    section = meta.get("model")
    if not isinstance(section, dict):
        raise ArtifactError(f"{path} has no \"model\" object describing the architecture; the checkpoint is damaged")
    try:
        return GPTConfig.from_dict(section)
    except ConfigError as e:
        raise ArtifactError(f"{path}: {e}; the checkpoint is damaged") from e


def load_model(folder: str | Path, device: str | torch.device = "cpu") -> tuple[torch.nn.Module, dict]:
    """Any artifact folder (float, pruned, int8, or a Hugging Face GPT-2 folder or hub name) as a ready model in
    eval mode.  Config and weights are read as one save (model/folder.py) and checked against each other."""
    folder = _existing(resolve_checkpoint(folder))
    with reading(folder):
        meta = _read_config(folder)
        if "model_type" in meta:  # a Hugging Face folder
            model = load_hf_gpt2(folder)
            meta = {"artifact": "float", "model": model.config.to_dict(), "produced_by": {"tool": "huggingface"}}
            return model.to(device).eval(), meta
        kind = meta.get("artifact")
        if kind not in ARTIFACT_KINDS:
            raise ArtifactError(f"{folder / CONFIG_FILE} names artifact kind {kind!r}; expected one of "
                                f"{ARTIFACT_KINDS}")
        config = model_config(meta, folder / CONFIG_FILE)
        state = read_safetensors(folder / WEIGHTS_FILE)
    source = f"{folder / WEIGHTS_FILE} (read against {folder / CONFIG_FILE})"
    if kind == "int8":
        model = build_int8_model(config, state, meta, source)
    else:
        with torch.device("meta"):
            model = GPT(config)
        load_weights(model, state, source)
    return model.to(device).eval(), meta


def claim_output_folder(folder: str | Path, tool: str, overwrite: bool) -> None:
    """Make this process the folder's one writer, for `tool`'s artifact.  A folder holding another tool's
    artifact (or something unreadable) is refused unless `overwrite`; then that artifact's files are removed
    first, so one folder never mixes two kinds (int8 weights beside a training run's optimizer state)."""
    folder = Path(folder)
    acquire_writer_lock(folder)
    if not (folder / CONFIG_FILE).exists():
        return
    try:
        meta = _read_config(folder)
        kind = str(meta.get("artifact"))
        owner = "a Hugging Face model" if "model_type" in meta else \
            f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind} artifact written by " \
            f"{(meta.get('produced_by') or {}).get('tool')}"
        if (meta.get("produced_by") or {}).get("tool") == tool or ("model_type" in meta and tool == "model.export"):
            return
    except ArtifactError as e:
        owner = f"a damaged artifact ({e})"
    if not overwrite:
        raise ArtifactError(f"{folder} already holds {owner}; pass --overwrite to replace it, or choose another "
                            f"output folder")
    remove_files(folder, previous_contents(folder) or [CONFIG_FILE, WEIGHTS_FILE])


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
