"""What a corpus is, for the corpora's sources (data/corpus.py, data/local_files.py) and their reader
(data/token_files.py): the splits, the names `--dataset` knows, a corpus and the passes that read its text."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

SPLITS = ("train", "validation", "test")
DATASET_NAMES = ("wikitext-103", "wikitext-2", "builtin", "hf:OWNER/NAME")  # besides a local path

Progress = Callable[[int], None]  # called with the bytes read since its last call


@dataclass(frozen=True)
class TextPass:
    """One read of a corpus's text: `read(progress)` yields (split, document) pairs for the `splits` it writes."""
    key: str  # the content and its cutting into documents; the token cache's folder name
    splits: tuple[str, ...]
    read: Callable[[Progress], Iterator[tuple[str, str]]]
    total_bytes: int | None = None  # for the progress bar; None where unknown
    # Where each split's text comes from, in words (its files and sizes, or how it was carved), for the data line
    # every run prints, whether it tokenizes or reads the cache.
    origins: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Corpus:
    name: str
    text_pass: Callable[[str], TextPass]  # the pass that writes a split

    def documents(self, split: str) -> Iterator[str]:
        """The split's documents in order (a carved split reads the whole pass)."""
        return (doc for which, doc in self.text_pass(split).read(lambda n: None) if which == split)
