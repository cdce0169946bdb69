"""The one artifact format: a folder with `config.json` and `model.safetensors`.

Every tool reads and writes these folders through this module.  How a folder is
changed safely (staged saves, one writer, readers that never see half a save)
is storage/folder.py; what is in it, and whether it is sound, is here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from model.config import GPTConfig
from model.gpt import GPT
from storage.folder import STAGING_DIR, reading, write_folder_atomically
from storage.hf import hf_weights, load_hf_gpt2
from storage.hub import resolve_checkpoint
from storage.int8_weights import build_int8_model, int8_state_for_saving
from storage.meta import ARTIFACT_KINDS, CONFIG_FILE, ArtifactMeta, Provenance
from storage.weights import ArtifactError, check_header, model_from_weights, read_header, read_safetensors

WEIGHTS_FILE = "model.safetensors"
DEFAULT_OUT_ROOT = Path("out")


def model_state_for_saving(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights to store: the tied output head is stored once (as the embedding)."""
    state = {k.removeprefix("_orig_mod."): v for k, v in model.state_dict().items()}
    state.pop("lm_head.weight", None)
    return {k: v.detach().contiguous().cpu() for k, v in state.items()}


def artifact_writers(model_state: dict[str, torch.Tensor], config: GPTConfig, kind: str, produced_by: dict,
                     extra: dict | None = None) -> dict[str, Callable[[Path], None]]:
    """How `write_folder_atomically` writes an artifact: `extra` holds its step, quantization or pruning."""
    if kind not in ARTIFACT_KINDS:
        raise ValueError(f"artifact kind {kind!r} is not one of {ARTIFACT_KINDS}")
    meta = ArtifactMeta(kind, config, Provenance(**produced_by), **(extra or {}))
    return {
        WEIGHTS_FILE: lambda p: save_file(model_state, str(p), metadata={"artifact": kind}),
        CONFIG_FILE: meta.write,
    }


def int8_artifact_writers(model: GPT, produced_by: dict, quantization: dict) -> dict[str, Callable[[Path], None]]:
    """`artifact_writers` for a model quantized by `model.int8.quantize_model`, which returned `quantization`."""
    return artifact_writers(int8_state_for_saving(model), model.config, "int8", produced_by,
                            extra={"quantization": quantization})


def save_artifact(folder, model: torch.nn.Module, config: GPTConfig, kind: str, produced_by: dict,
                  extra: dict | None = None) -> None:
    write_folder_atomically(folder, artifact_writers(model_state_for_saving(model), config, kind,
                                                     produced_by, extra))


def read_meta(folder: str | Path) -> ArtifactMeta:
    """The folder's config.json (an artifact's or a Hugging Face folder's), checked."""
    folder = _existing(folder)
    with reading(folder):
        return ArtifactMeta.read(folder)


def _existing(folder: str | Path) -> Path:
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactError(f"checkpoint folder {folder} does not exist; train one with `python train.py` "
                            f"or pass --checkpoint DIR")
    return folder


def load_model(folder: str | Path, device: str | torch.device = "cpu", kinds: tuple[str, ...] = ARTIFACT_KINDS,
               why: str = "") -> tuple[torch.nn.Module, ArtifactMeta]:
    """Any artifact folder (float, pruned, int8, or a Hugging Face GPT-2 folder or hub name) as a ready model in
    eval mode.  Config and weights are read as one save (storage/folder.py) and checked against each other.
    A kind outside `kinds` is refused before its weights are read, saying `why` and what to load instead."""
    folder = _existing(resolve_checkpoint(folder))
    with reading(folder):
        meta = ArtifactMeta.read(folder)
        if meta.kind not in kinds:
            raise wrong_kind(folder, meta, kinds, why)
        check_weights_header(folder, meta)
        if meta.is_hugging_face:
            return load_hf_gpt2(folder, meta.model).to(device).eval(), meta
        state = read_safetensors(folder / WEIGHTS_FILE)
    source = f"{folder / WEIGHTS_FILE} (read against {folder / CONFIG_FILE})"
    if meta.kind == "int8":
        model = build_int8_model(meta.model, state, meta.quantization, source)
    else:
        model = model_from_weights(meta.model, state, source)
    return model.to(device).eval(), meta


def check_weights_header(folder: Path, meta: ArtifactMeta) -> None:
    weights = hf_weights(folder) if meta.is_hugging_face else folder / WEIGHTS_FILE
    check_header(meta.model, read_header(weights), weights, folder / CONFIG_FILE)


def wrong_kind(folder: Path, meta: ArtifactMeta, kinds: tuple[str, ...], why: str) -> ArtifactError:
    wanted = " or ".join(kinds)
    source = meta.produced_by.source
    fix = (f"Use the {wanted} checkpoint it was made from: --checkpoint {source}" if source else
           f"Use the {wanted} checkpoint it was made from")
    return ArtifactError(f"{folder} is {meta.described}"
                         f"{'; ' + why if why else ''}. {fix}")


def artifact_folders(root: str | Path = DEFAULT_OUT_ROOT,
                     accept: Callable[[ArtifactMeta], bool] | None = None) -> list[Path]:
    """Every artifact folder at or below `root` whose config.json satisfies `accept`.

    Folders whose config.json cannot be read are skipped here; naming one with --checkpoint reports the damage.
    """
    folders = []
    for path in Path(root).rglob(CONFIG_FILE):
        if STAGING_DIR in path.parts:
            continue
        if accept is not None:
            try:
                meta = ArtifactMeta.read(path.parent)
            except (OSError, ArtifactError):
                continue
            if not accept(meta):
                continue
        folders.append(path.parent)
    return folders
