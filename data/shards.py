"""Tokenize a corpus split once into a uint16 file with a small header; memory-map it afterwards.

Layout (after llm.c): a 256-int32 header [magic, version, token count, ...] then the tokens.
Documents are joined with end-of-text.  Files live under `$GPT2_DATA_CACHE` (default `.cache/tokens`
in the project) in a folder keyed by the corpus fingerprint and the tokenizer.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data.corpus import SPLITS, Corpus, DatasetError, get_corpus
from data.tokenizer import GPT2_RANKS_SHA256, get_tokenizer
from model.config import EOT_TOKEN

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
DEFAULT_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "tokens"
TOKENIZER_ID = f"gpt2-{GPT2_RANKS_SHA256[:8]}"


def cache_root() -> Path:
    return Path(os.environ.get("GPT2_DATA_CACHE", DEFAULT_CACHE))


def shard_path(corpus: Corpus, split: str) -> Path:
    return cache_root() / f"{corpus.fingerprint}-{TOKENIZER_ID}" / f"{split}.bin"


def write_tokens(path: Path, tokens: np.ndarray) -> None:
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = (MAGIC, VERSION, len(tokens))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(np.uint16).tobytes())
    tmp.replace(path)


def read_tokens(path: Path) -> np.ndarray:
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    if len(header) < 3 or header[0] != MAGIC:
        raise DatasetError(f"{path} is not a token file (bad magic); delete it and it will be rebuilt")
    if header[1] != VERSION:
        raise DatasetError(f"{path} has format version {header[1]}, this code reads {VERSION}; delete it")
    count = int(header[2])
    tokens = np.memmap(path, dtype=np.uint16, mode="r", offset=HEADER_INTS * 4)
    if len(tokens) != count:
        raise DatasetError(f"{path} holds {len(tokens)} tokens but its header says {count}: truncated; delete it")
    return tokens


def tokenize_split(corpus: Corpus, split: str) -> np.ndarray:
    tokenizer = get_tokenizer()
    chunks = []
    docs = corpus.documents(split)
    with tqdm(desc=f"tokenizing {corpus.name} {split}", unit=" docs", leave=False) as bar:
        batch: list[str] = []
        for doc in docs:
            batch.append(doc)
            if len(batch) == 256:
                chunks.extend(_encode_batch(tokenizer, batch))
                bar.update(len(batch))
                batch = []
        if batch:
            chunks.extend(_encode_batch(tokenizer, batch))
            bar.update(len(batch))
    if not chunks:
        raise DatasetError(f"{corpus.name} split {split} has no text")
    return np.concatenate(chunks)


def _encode_batch(tokenizer, docs: list[str]) -> list[np.ndarray]:
    encoded = tokenizer.encode_ordinary_batch(docs, num_threads=os.cpu_count() or 1)
    return [np.array(ids + [EOT_TOKEN], dtype=np.uint16) for ids in encoded]


def load_split(dataset: str | Corpus, split: str) -> np.ndarray:
    """The split's tokens as a read-only memmap, tokenizing on first use."""
    if split not in SPLITS:
        raise DatasetError(f"unknown split {split!r}; choose one of {SPLITS}")
    corpus = get_corpus(dataset) if isinstance(dataset, str) else dataset
    path = shard_path(corpus, split)
    if not path.exists():
        write_tokens(path, tokenize_split(corpus, split))
    return read_tokens(path)
