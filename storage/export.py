"""Export an artifact as a Hugging Face GPT-2 folder that transformers' `GPT2LMHeadModel.from_pretrained` loads.

    python -m storage.export --checkpoint out/demo/train --out out/demo/hf

Float checkpoints and magnitude-pruned ones (same shapes, zeros kept) export as they are.  Refused, with the
reason: row-pruned artifacts (per-layer widths that GPT-2's config cannot express) and int8 artifacts
(transformers' GPT-2 has no int8 layers; export the float checkpoint the int8 one was made from).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import save_file

from model.gpt import GPT
from runtime.cli import entry_point, option, parse_config
from storage.artifact import WEIGHTS_FILE, load_model
from storage.claim import EXPORT_TOOL, claim_output_folder
from storage.folder import write_folder_atomically
from storage.hf import ours_to_hf
from storage.meta import CONFIG_FILE, HUGGING_FACE, ArtifactMeta, Provenance
from storage.run_folder import pick_checkpoint
from storage.weights import ArtifactError


@dataclass
class ExportConfig:
    checkpoint: str | None = option(None, "artifact folder to export (float or magnitude-pruned) "
                                          "(default: the train.py checkpoint under out/ trained on the most tokens)")
    out: str = option("out/hf", "folder to write config.json and model.safetensors to")
    overwrite: bool = option(False, "write into --out even though it holds one of this "
                                    "project's artifacts (whose files are removed first)")


def export_hf_gpt2(model: GPT, folder: str | Path) -> None:
    """Write a folder that transformers' GPT2LMHeadModel.from_pretrained loads."""
    state = ours_to_hf(model.state_dict(), model.config)
    write_folder_atomically(folder, {  # the config first: a row-pruned one is refused before the weights are written
        CONFIG_FILE: ArtifactMeta("float", model.config, Provenance(tool=HUGGING_FACE)).write,
        WEIGHTS_FILE: lambda p: save_file(state, str(p), metadata={"format": "pt"}),
    })


def export(cfg: ExportConfig) -> Path:
    folder, why = pick_checkpoint(cfg.checkpoint)
    print(f"model: {folder} ({why})", file=sys.stderr)
    model, _ = load_model(folder, kinds=("float", "pruned"), why="transformers' GPT-2 has no int8 layers")
    c = model.config
    if c.mlp_hidden is not None or c.n_head_per_layer is not None:
        raise ArtifactError(f"{folder} is row-pruned: its per-layer widths cannot be written as a "
                            f"Hugging Face GPT-2 config. Export the checkpoint it was pruned from, or a "
                            f"magnitude-pruned one")
    claim_output_folder(cfg.out, EXPORT_TOOL, cfg.overwrite, source=folder, out_flag="--out")
    export_hf_gpt2(model, cfg.out)
    return Path(cfg.out)


@entry_point
def main(argv=None) -> None:
    out = export(parse_config(ExportConfig, __doc__, argv))
    print(f"wrote {out}/config.json and {out}/model.safetensors (load with "
          f"transformers.GPT2LMHeadModel.from_pretrained({str(out)!r}))")


if __name__ == "__main__":
    main()
