"""Pretrained GPT-2 by name: `gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl` or any hub id `org/name`.

The two files a GPT-2 needs (`config.json`, `model.safetensors`) come through `huggingface_hub` into its
cache (`HF_HOME` / `HF_HUB_CACHE`), and from that cache when the hub cannot be reached or `HF_HUB_OFFLINE=1`
is set.  Every tool that takes `--checkpoint` (and `train.py --init-from`) accepts these names; a local
folder of the same name wins.  A bare GPT-2 name is looked up under `openai-community/<name>` first, then
under `<name>`, where `from_pretrained("gpt2")` caches it.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from storage.weights import ArtifactError

# OpenAI's checkpoints live under this organisation on the hub; the bare names are what nanoGPT users type.
GPT2_NAMES = {name: f"openai-community/{name}" for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}
HUB_FILES = ["config.json", "model.safetensors"]
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hub_name(source: str | Path) -> bool:
    text = str(source)
    return not Path(text).exists() and (text in GPT2_NAMES or HUB_ID.fullmatch(text) is not None)


def hub_repos(source: str) -> list[str]:
    """The repos whose cache may hold `source`, canonical first: `from_pretrained("gpt2")` (the id before the
    models moved to openai-community) keeps its files under models--gpt2, and they are the same weights."""
    if source in GPT2_NAMES:
        return [GPT2_NAMES[source], source]
    return [source]


def resolve_checkpoint(source: str | Path) -> Path:
    """A local folder as it is; a hub name as its snapshot folder in the cache (downloaded if need be)."""
    if not is_hub_name(source):
        return Path(source)
    from huggingface_hub import snapshot_download  # imported on use: the hub client is slow to import

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    repos = hub_repos(str(source))
    incomplete, error = None, None
    for i, repo in enumerate(repos):
        try:  # only the canonical repo is downloaded; the others are looked up in the cache
            folder = Path(snapshot_download(repo, allow_patterns=HUB_FILES, local_files_only=offline or i > 0,
                                            cache_dir=os.environ.get("HF_HUB_CACHE")))
        except Exception as e:  # the hub client raises many kinds for "not cached and not reachable"
            error = error or e
            continue
        if all((folder / name).exists() for name in HUB_FILES):
            return folder
        incomplete = incomplete or (repo, folder)
    if incomplete is not None:
        repo, folder = incomplete
        missing = [name for name in HUB_FILES if not (folder / name).exists()]
        raise ArtifactError(f"{repo} has no {', '.join(missing)} on the hub or in the cache ({folder}); only "
                            f"GPT-2 checkpoints stored as safetensors can be loaded")
    repo = repos[0]
    also = f" (nor under {', '.join(repos[1:])})" if len(repos) > 1 else ""
    raise ArtifactError(
        f"{source}: the files of {repo}{also} ({', '.join(HUB_FILES)}) are not in the Hugging Face cache and the "
        f"hub could not be reached ({type(error).__name__}). On a machine with internet run `python -c \"from "
        f"huggingface_hub import snapshot_download; snapshot_download('{repo}', allow_patterns={HUB_FILES})\"` "
        f"and copy its cache (HF_HOME) here, or put the two files in a folder and pass that folder") from error
