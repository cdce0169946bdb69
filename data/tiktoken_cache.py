"""Fill tiktoken's own download cache from the verified ranks file, so `tiktoken.get_encoding("gpt2")`,
`get_encoding("r50k_base")` and `encoding_for_model("gpt2")` work offline in any program on this machine.

tiktoken looks for each file it would download under `$TIKTOKEN_CACHE_DIR` (else `$DATA_GYM_CACHE_DIR`, else
`<tempdir>/data-gym-cache`), named by the SHA-1 of its URL, and accepts it only if its SHA-256 is the one
tiktoken_ext/openai_public.py expects.  `r50k_base` reads the ranks file itself; `gpt2` reads the original
GPT-2 release's `vocab.bpe` (the merges) and `encoder.json` (token to id), which are rebuilt here from the
ranks byte for byte: each file is checked against tiktoken's hash before it is written.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from data.tokenizer import TokenizerError, parse_ranks, read_ranks_file

# URL -> SHA-256, as tiktoken_ext/openai_public.py names them.
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
VOCAB_BPE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe"
ENCODER_JSON_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json"
EXPECTED_SHA256 = {
    R50K_URL: "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
    VOCAB_BPE_URL: "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    ENCODER_JSON_URL: "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}


def default_cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def cache_dir() -> Path | None:
    """tiktoken's cache folder, chosen as tiktoken/load.py chooses it; None when it is set to "" (no cache)."""
    for name in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if name in os.environ:
            return Path(os.environ[name]) if os.environ[name] else None
    return default_cache_dir()


def byte_to_char() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (data_gym_to_mergeable_bpe_ranks inverts it): printable bytes
    other than space are themselves, the rest are chr(256), chr(257), ... in byte order."""
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}


def merge_parts(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The pair whose merge made `token`: BPE on its bytes with only the merges ranked before it leaves two parts."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        candidates = [(ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1)]
        best, i = min(candidates)
        if best >= rank:
            raise TokenizerError(f"token {token!r} (rank {rank}) is not a merge of earlier tokens")
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts[0], parts[1]


def gpt2_release_files(ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """(vocab.bpe, encoder.json) as OpenAI released them, from the ranks."""
    chars = byte_to_char()

    def text(token: bytes) -> str:
        return "".join(chars[b] for b in token)

    by_rank = sorted(ranks.items(), key=lambda item: item[1])
    merges = [" ".join(map(text, merge_parts(token, rank, ranks))) for token, rank in by_rank[256:]]
    vocab_bpe = ("#version: 0.2\n" + "".join(m + "\n" for m in merges)).encode()
    encoder = {**{text(token): rank for token, rank in by_rank}, "<|endoftext|>": len(by_rank)}
    return vocab_bpe, json.dumps(encoder).encode()


def fill_cache(ranks_file: Path, folder: Path) -> list[Path]:
    """Write the three files tiktoken's gpt2 and r50k_base encodings download into `folder`; their paths."""
    data = read_ranks_file(ranks_file)
    vocab_bpe, encoder_json = gpt2_release_files(parse_ranks(data))
    files = {R50K_URL: data, VOCAB_BPE_URL: vocab_bpe, ENCODER_JSON_URL: encoder_json}
    for url, content in files.items():  # all checked before any is written
        digest = hashlib.sha256(content).hexdigest()
        if digest != EXPECTED_SHA256[url]:  # tiktoken would discard the file and go online
            raise TokenizerError(f"the {url.rsplit('/', 1)[1]} rebuilt from {ranks_file} has SHA-256 {digest}, "
                                 f"not the {EXPECTED_SHA256[url]} tiktoken expects; nothing was written")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for url, content in files.items():
            path = folder / hashlib.sha1(url.encode()).hexdigest()
            tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
            tmp.write_bytes(content)
            tmp.replace(path)
            written.append(path)
    except OSError as e:
        raise TokenizerError(f"tiktoken's cache {folder} cannot be written ({e.strerror}); set "
                             f"TIKTOKEN_CACHE_DIR to a folder you can write to") from e
    return written
