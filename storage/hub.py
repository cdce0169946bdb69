"""Pretrained GPT-2 by name: `gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl` or any hub id `org/name`.

A model flag's value is a local folder when one of that name exists, and a hub name only when it is one of the
GPT-2 names or a bare `owner/name`.  One that looks local (`looks_local`) and is not there is "no such folder",
with the nearest existing names, and never a hub download: `out/train` misspelt must not send the user to
`snapshot_download`.

The two files a GPT-2 needs (`config.json`, `model.safetensors`) come through `huggingface_hub` into its
cache (`HF_HOME` / `HF_HUB_CACHE`), and from that cache when the hub cannot be reached or `HF_HUB_OFFLINE=1`
is set.  Every tool that takes `--checkpoint` (and `train.py --init-from`) accepts these names; a local
folder of the same name wins.  A bare GPT-2 name is looked up under `openai-community/<name>` first, then
under `<name>`, where `from_pretrained("gpt2")` caches it.
"""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from storage.weights import ArtifactError

# OpenAI's checkpoints live under this organisation on the hub; the bare names are what nanoGPT users type.
GPT2_NAMES = {name: f"openai-community/{name}" for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}
HUB_FILES = ["config.json", "model.safetensors"]
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# Names suggested for a folder that is not there, at most.
SUGGESTIONS = 3
# Folders listed when none is named like the missing one, at most.
LISTED_FOLDERS = 6


def _is_dir(path: Path) -> bool:
    """Whether a folder is there; a name the system cannot even look up (too long, a null byte) is not one."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def looks_local(text: str) -> bool:
    """A model name typed as a path: it starts with `.`, `/` or `~`, holds a backslash or more than one `/`, or its
    first part names something in the working directory (`out/train` when out/ exists)."""
    return (text.startswith((".", "/", "~")) or "\\" in text or text.count("/") > 1
            or _exists(Path(text.split("/")[0])))


def is_hub_name(source: str | Path) -> bool:
    text = str(source)
    return (not _exists(Path(text)) and not looks_local(text)
            and (text in GPT2_NAMES or HUB_ID.fullmatch(text) is not None))


def shown(text: str) -> str:
    """A name as one printable line: control characters and undecodable bytes escaped."""
    return text if text.isprintable() else ascii(text)


def nearest_existing(path: Path) -> tuple[Path, str]:
    """The nearest folder above `path` that exists, and the name under it that does not."""
    missing = path
    for parent in path.parents:
        if _is_dir(parent):
            return parent, missing.name
        missing = parent
    return Path("."), missing.name


def folder_names(folder: Path, hidden: bool) -> list[str]:
    try:
        names = [entry.name for entry in folder.iterdir() if _is_dir(entry)]
    except OSError:  # unreadable: nothing to suggest from it
        return []
    return sorted(name for name in names if hidden or not name.startswith("."))


def no_such_folder(text: str, flag: str | None) -> ArtifactError:
    """"no such folder", with the folders named most like it beside it (or, failing those, some that are there)."""
    parent, missing = nearest_existing(Path(text))
    names = folder_names(parent, hidden=missing.startswith("."))
    hub_names = list(GPT2_NAMES) if "/" not in text else []  # `gtp2` meant gpt2

    def display(name: str) -> str:
        return shown(name if parent == Path(".") else str(parent / name))
    close = difflib.get_close_matches(missing, names + hub_names, n=SUGGESTIONS)
    if close:
        hint = f"did you mean {' or '.join(display(name) for name in close)}?"
    else:
        where = "the working directory" if parent == Path(".") else shown(str(parent))
        listed = ", ".join(shown(name) for name in names[:LISTED_FOLDERS])
        hint = (f"{where} holds {listed}{', ...' if len(names) > LISTED_FOLDERS else ''}" if names else
                f"{where} holds no folders")
    prefix = f"{flag}: " if flag else ""
    return ArtifactError(f"{prefix}no such folder: {shown(text)}; {hint} (a hub name is {', '.join(GPT2_NAMES)} or "
                         f"a bare owner/name)")


def check_model_name(source: str | Path, flag: str | None = None) -> None:
    """Refuse, before any model loads, a model name that is neither a folder here nor a hub name (`flag`: the
    option that gave it, for the message).  A file is refused too: a model is a folder."""
    text = str(source)
    if _is_dir(Path(text)) or is_hub_name(text):
        return
    if _exists(Path(text)):
        raise ArtifactError(f"{flag + ': ' if flag else ''}{shown(text)} is a file; a model is a folder holding "
                            f"config.json and model.safetensors")
    raise no_such_folder(text, flag)


def hub_repos(source: str) -> list[str]:
    """The repos whose cache may hold `source`, canonical first: `from_pretrained("gpt2")` (the id before the
    models moved to openai-community) keeps its files under models--gpt2, and they are the same weights."""
    if source in GPT2_NAMES:
        return [GPT2_NAMES[source], source]
    return [source]


def resolve_checkpoint(source: str | Path, flag: str | None = None) -> Path:
    """A local folder as it is; a hub name as its snapshot folder in the cache (downloaded if need be).  Anything
    else is refused (`check_model_name`)."""
    check_model_name(source, flag)
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
