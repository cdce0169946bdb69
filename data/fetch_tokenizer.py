"""Fetch GPT-2's BPE ranks offline-friendly: from the openai-whisper source distribution on PyPI.

That sdist ships `whisper/assets/gpt2.tiktoken`, byte-identical to tiktoken's r50k_base file.  Unless
--no-tiktoken-cache, tiktoken's own cache is filled from it too (data/tiktoken_cache.py), so that
tiktoken.get_encoding("gpt2") and ("r50k_base") work offline in any program.
Usage: python -m data.fetch_tokenizer [--dest PATH] [--no-tiktoken-cache]
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from data.tiktoken_cache import cache_dir, default_cache_dir, fill_cache
from data.tokenizer import DEFAULT_RANKS_FILE, GPT2_RANKS_SHA256, TokenizerError
from runtime.cli import entry_point, option, parse_config

SDIST = "openai-whisper==20250625"
MEMBER_SUFFIX = "whisper/assets/gpt2.tiktoken"


def fetch(dest: Path) -> Path:
    if dest.exists() and hashlib.sha256(dest.read_bytes()).hexdigest() == GPT2_RANKS_SHA256:
        print(f"tokenizer: {dest} already present and verified")
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               SDIST, "-d", tmp]
        result = subprocess.run(cmd, capture_output=True, text=True)
        archives = list(Path(tmp).glob("*.tar.gz"))
        if result.returncode != 0 or not archives:
            raise TokenizerError(f"could not download {SDIST} from PyPI:\n{result.stderr.strip()}\n"
                                 f"Alternatively set GPT2_TIKTOKEN_FILE to a copy of GPT-2's r50k_base.tiktoken.")
        with tarfile.open(archives[0]) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith(MEMBER_SUFFIX)), None)
            if member is None:
                raise TokenizerError(f"{archives[0].name} has no {MEMBER_SUFFIX}")
            data = tar.extractfile(member).read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != GPT2_RANKS_SHA256:
        raise TokenizerError(f"the ranks file in {SDIST} has SHA-256 {digest}, expected {GPT2_RANKS_SHA256}; "
                             f"refusing it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp_dest = dest.with_suffix(".tmp")
    tmp_dest.write_bytes(data)
    tmp_dest.replace(dest)
    print(f"tokenizer: wrote {dest} (SHA-256 verified)")
    return dest


def fill_tiktoken_cache(ranks_file: Path) -> None:
    folder = cache_dir()
    if folder is None:
        print("tiktoken cache: not filled, TIKTOKEN_CACHE_DIR is empty, which turns tiktoken's cache off")
        return
    fill_cache(ranks_file, folder)
    print(f"tiktoken cache: wrote the files of tiktoken's gpt2 and r50k_base encodings to {folder} (SHA-256 "
          f"verified)")
    if folder == default_cache_dir():
        print("tiktoken cache: that is a temporary folder; set TIKTOKEN_CACHE_DIR (here and where tiktoken runs) "
              "to keep them")


@dataclass
class FetchConfig:
    dest: Path = option(DEFAULT_RANKS_FILE, "where to write the verified ranks file")
    tiktoken_cache: bool = option(True, "also fill tiktoken's own cache ($TIKTOKEN_CACHE_DIR, else "
                                        "$DATA_GYM_CACHE_DIR, else <tempdir>/data-gym-cache)")


@entry_point
def main(argv=None):
    cfg = parse_config(FetchConfig, __doc__, argv)
    fetch(cfg.dest)
    if cfg.tiktoken_cache:
        fill_tiktoken_cache(cfg.dest)


if __name__ == "__main__":
    main()
