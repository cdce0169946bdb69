"""One way of tokenizing a WikiText folder's training split, timed in a fresh process for
bench/experiments/data_prep.py as a user's first start is: `ours` (data.token_files.prepare_split: read from the file, cut
into documents, encoded by a thread per core, written to the token file), `tiktoken` (its own multi-threaded
encode_ordinary_batch on the documents already in memory) or `map` (nanoGPT's prepare.py: datasets.map of
encode_ordinary over the documents, then the tokens written into a np.memmap in shards).  Prints the seconds and the
encoding threads as JSON.

    python -m bench.workloads.tokenize_split ours|tiktoken|map FOLDER MAP_PROCESSES
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from data.local_files import local_corpus
from data.token_files import encoding_threads, prepare_split
from data.tokenizer import get_tokenizer


def tokenize(method: str, folder: Path, threads: int, map_processes: int) -> float:
    """Seconds `method` takes over the folder's training split (the tokenizer loaded before, for every method)."""
    if method == "ours":
        start = time.perf_counter()
        prepare_split(str(folder), "train")
        return time.perf_counter() - start
    docs = list(local_corpus(folder).documents("train"))  # not timed: the text is already in memory
    encoder = get_tokenizer()
    if method == "tiktoken":
        start = time.perf_counter()
        encoder.encode_ordinary_batch(docs, num_threads=threads)
        return time.perf_counter() - start
    # Only this method's process imports datasets.
    import datasets
    import numpy as np
    datasets.disable_progress_bars()
    table = datasets.Dataset.from_dict({"text": docs})
    del docs

    def process(example):
        ids = encoder.encode_ordinary(example["text"]) + [encoder.eot_token]
        return {"ids": ids, "len": len(ids)}
    start = time.perf_counter()
    tokenized = table.map(process, remove_columns=["text"], num_proc=map_processes)
    total = int(np.sum(tokenized["len"], dtype=np.uint64))
    out = np.memmap(folder / "nanogpt.bin", dtype=np.uint16, mode="w+", shape=(total,))
    shards, index = min(64, len(tokenized)), 0
    for shard in range(shards):
        batch = tokenized.shard(num_shards=shards, index=shard, contiguous=True).with_format("numpy")
        ids = np.concatenate(batch["ids"])
        out[index:index + len(ids)] = ids
        index += len(ids)
    out.flush()
    return time.perf_counter() - start


if __name__ == "__main__":
    threads = encoding_threads()
    get_tokenizer()
    seconds = tokenize(sys.argv[1], Path(sys.argv[2]), threads, int(sys.argv[3]))
    print(json.dumps({"seconds": seconds, "threads": threads}))
