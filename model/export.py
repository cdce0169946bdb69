"""Export an artifact as a Hugging Face GPT-2 folder that transformers' `GPT2LMHeadModel.from_pretrained` loads.

    python -m model.export --checkpoint out/demo/train --out out/demo/hf

Float checkpoints and magnitude-pruned ones (same shapes, zeros kept) export as they are.  Refused, with the
reason: row-pruned artifacts (per-layer widths that GPT-2's config cannot express) and int8 artifacts
(transformers' GPT-2 has no int8 layers; export the float checkpoint the int8 one was made from).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from model.artifact import ArtifactError, claim_output_folder, load_model
from model.hf import export_hf_gpt2
from runtime.cli import option, parse_config
from runtime.errors import UserError


@dataclass
class ExportConfig:
    checkpoint: str = option("out/demo/train", "artifact folder to export (float or "
                                               "magnitude-pruned)")
    out: str = option("out/hf", "folder to write config.json and model.safetensors to")
    overwrite: bool = option(False, "write into --out even though it holds one of this "
                                    "project's artifacts (whose files are removed first)")


def export(cfg: ExportConfig) -> Path:
    model, meta = load_model(cfg.checkpoint)
    if meta.get("artifact") == "int8":
        source = (meta.get("produced_by") or {}).get("source")
        raise ArtifactError(f"{cfg.checkpoint} is an int8 artifact; transformers' GPT-2 has no int8 layers. "
                            f"Export the float checkpoint it was quantized from"
                            f"{f' ({source})' if source else ''} instead")
    c = model.config
    if c.mlp_hidden is not None or c.n_head_per_layer is not None:
        raise ArtifactError(f"{cfg.checkpoint} is row-pruned: its per-layer widths cannot be written as a "
                            f"Hugging Face GPT-2 config. Export the checkpoint it was pruned from, or a "
                            f"magnitude-pruned one")
    if Path(cfg.out).resolve() == Path(cfg.checkpoint).resolve():
        raise ArtifactError(f"--out {cfg.out} is the checkpoint being exported; choose another folder")
    claim_output_folder(cfg.out, "model.export", cfg.overwrite)
    export_hf_gpt2(model, cfg.out)
    return Path(cfg.out)


def main(argv=None) -> None:
    try:
        out = export(parse_config(ExportConfig, __doc__, argv))
    except UserError as e:
        sys.exit(f"error: {e}")
    print(f"wrote {out}/config.json and {out}/model.safetensors (load with "
          f"transformers.GPT2LMHeadModel.from_pretrained({str(out)!r}))")


if __name__ == "__main__":
    main()
