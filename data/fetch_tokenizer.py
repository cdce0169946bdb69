"""Fetch GPT-2's BPE ranks offline-friendly: from the openai-whisper source distribution on PyPI.

That sdist ships `whisper/assets/gpt2.tiktoken`, byte-identical to tiktoken's r50k_base file.
Usage: python -m data.fetch_tokenizer [--dest PATH]
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from data.tokenizer import DEFAULT_RANKS_FILE, GPT2_RANKS_SHA256
from runtime.cli import option, parse_config

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
            sys.exit(f"could not download {SDIST} from PyPI:\n{result.stderr.strip()}\n"
                     f"Alternatively set GPT2_TIKTOKEN_FILE to a copy of GPT-2's r50k_base.tiktoken.")
        with tarfile.open(archives[0]) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith(MEMBER_SUFFIX)), None)
            if member is None:
                sys.exit(f"{archives[0].name} has no {MEMBER_SUFFIX}")
            data = tar.extractfile(member).read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != GPT2_RANKS_SHA256:
        sys.exit(f"the ranks file in {SDIST} has SHA-256 {digest}, expected {GPT2_RANKS_SHA256}; refusing it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp_dest = dest.with_suffix(".tmp")
    tmp_dest.write_bytes(data)
    tmp_dest.replace(dest)
    print(f"tokenizer: wrote {dest} (SHA-256 verified)")
    return dest


@dataclass
class FetchConfig:
    dest: Path = option(DEFAULT_RANKS_FILE, "where to write the verified ranks file")


def main(argv=None):
    fetch(parse_config(FetchConfig, __doc__, argv).dest)


if __name__ == "__main__":
    main()
