"""An artifact's `config.json`, typed: `ArtifactMeta` is the one reader and writer of that file.

Every field read is checked (the kind is a known one, the model section a valid config, counts are counts,
provenance is text), so a damaged or hand-edited file is one error naming the file, the field and the fix,
never a KeyError in whichever tool happens to read it.  A Hugging Face GPT-2 folder reads as a float model.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from model.config import ConfigError, GPTConfig
from storage.hf import config_from_hf, config_to_hf
from storage.weights import ArtifactError, one_line
from runtime.parsed import Unparsable, json_value

CONFIG_FILE = "config.json"
ARTIFACT_KINDS = ("float", "pruned", "int8")
HUGGING_FACE = "huggingface"  # the producer named for a Hugging Face folder, which records none of ours
DAMAGED = "the checkpoint is damaged; re-create it with the tool that wrote it"


@dataclass(frozen=True)
class Provenance:
    """What produced an artifact (runtime/provenance.py fills it)."""
    tool: str | None = None
    source: str | None = None
    git_commit: str | None = None
    date: str | None = None


@dataclass
class ArtifactMeta:
    kind: str  # one of ARTIFACT_KINDS
    model: GPTConfig
    produced_by: Provenance
    step: int | None = None  # a training checkpoint's step
    quantization: dict | None = None  # an int8 artifact's quantized layers and head format
    pruning: dict | None = None  # a pruned artifact's method, settings and dataset

    @property
    def is_hugging_face(self) -> bool:
        return self.produced_by.tool == HUGGING_FACE

    @property
    def described(self) -> str:
        """"an int8 artifact", "a float artifact": the kind as messages name it."""
        return f"{'an' if self.kind[:1] in 'aeiou' else 'a'} {self.kind} artifact"

    def to_dict(self) -> dict:
        if self.is_hugging_face:  # their config.json, which records none of ours
            return config_to_hf(self.model)
        extra = {k: v for k, v in (("step", self.step), ("quantization", self.quantization),
                                   ("pruning", self.pruning)) if v is not None}
        return {"artifact": self.kind, "model": self.model.to_dict(),
                "produced_by": dataclasses.asdict(self.produced_by), **extra}

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def read(cls, folder: Path) -> "ArtifactMeta":
        """The folder's config.json (the caller holds the folder for reading, storage/folder.py)."""
        path = folder / CONFIG_FILE
        if not path.exists():
            raise ArtifactError(f"{folder} has no {CONFIG_FILE}: it is not a checkpoint folder")
        try:
            data = json_value(path.read_bytes())
        except Unparsable as e:
            raise ArtifactError(f"{path} is not readable JSON ({one_line(e)}); the checkpoint is damaged") from e
        return cls.from_dict(data, path)

    @classmethod
    def from_dict(cls, data, path: Path) -> "ArtifactMeta":
        if not isinstance(data, dict):
            raise ArtifactError(f"{path} holds a JSON {json_kind(data)}, not an object; the checkpoint is damaged")
        if "model_type" in data:  # a Hugging Face folder
            return cls("float", config_from_hf(data, path), Provenance(tool=HUGGING_FACE))
        kind = data.get("artifact")
        if kind not in ARTIFACT_KINDS:
            raise ArtifactError(f"{path} names artifact kind {kind!r}; expected one of {ARTIFACT_KINDS}")
        section = data.get("model")
        if not isinstance(section, dict):
            raise ArtifactError(f"{path} has no \"model\" object describing the architecture; the checkpoint is "
                                f"damaged")
        try:
            model = GPTConfig.from_dict(section)
        except ConfigError as e:
            raise ArtifactError(f"{path}: {e}; the checkpoint is damaged") from e
        step = data.get("step")
        if step is not None and (type(step) is not int or step < 0):
            raise ArtifactError(f"{path}: \"step\" is {step!r}, not a count of steps; {DAMAGED}")
        for name in ("quantization", "pruning"):
            if data.get(name) is not None and not isinstance(data[name], dict):
                raise ArtifactError(f"{path}: \"{name}\" is a JSON {json_kind(data[name])}, not an object; {DAMAGED}")
        return cls(kind, model, provenance_of(data.get("produced_by"), path), step, data.get("quantization"),
                   data.get("pruning"))


def provenance_of(section, path: Path) -> Provenance:
    if section is None:
        return Provenance()
    if not isinstance(section, dict):
        raise ArtifactError(f"{path}: \"produced_by\" is a JSON {json_kind(section)}, not an object; {DAMAGED}")
    fields = {}
    for field in dataclasses.fields(Provenance):
        value = section.get(field.name)
        if value is not None and not isinstance(value, str):
            raise ArtifactError(f"{path}: \"produced_by.{field.name}\" is {value!r}, not text; {DAMAGED}")
        fields[field.name] = value
    return Provenance(**fields)


def json_kind(value) -> str:
    return {"list": "list", "str": "string", "int": "number", "float": "number", "bool": "boolean",
            "dict": "object"}.get(type(value).__name__, "null")
