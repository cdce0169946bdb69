import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from data import corpus, hub_access, token_files
from data.corpus import DatasetError, builtin_corpus, get_corpus
from data.documents import split_articles
from data.loader import WindowSampler, eval_batches
from data.token_files import load_split, read_tokens, write_tokens

ARTICLE = " = {title} = \n \n {title} is a thing . It has @-@ parts . \n \n = = Section = = \n \n More text . \n"


def write_raw_folder(folder, titles_per_split):
    folder.mkdir(parents=True, exist_ok=True)
    names = {"train": "wiki.train.raw", "validation": "wiki.valid.raw", "test": "wiki.test.raw"}
    for split, titles in titles_per_split.items():
        (folder / names[split]).write_text(" \n" + "".join(ARTICLE.format(title=t) for t in titles))


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2_DATA_CACHE", str(tmp_path / "cache"))


def test_articles_split_at_top_level_headings_only():
    text = " \n" + ARTICLE.format(title="Alpha") + ARTICLE.format(title="Beta")
    articles = list(split_articles(text))
    assert len(articles) == 2
    assert " = = Section = = " in articles[0] and articles[1].startswith(" = Beta = ")
    assert "".join(articles) == text


def test_local_raw_folder_tokenizes_with_eot_between_documents(tmp_path):
    write_raw_folder(tmp_path / "wt", {"train": ["Alpha", "Beta"], "validation": ["Gamma"]})
    tokens = load_split(str(tmp_path / "wt"), "train")
    assert (np.asarray(tokens) == 50256).sum() == 2 and tokens[-1] == 50256
    with pytest.raises(DatasetError, match="has no test split: expected wiki.test.raw"):
        load_split(str(tmp_path / "wt"), "test")


def test_local_parquet_folder_in_hub_layout_matches_raw(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    write_raw_folder(tmp_path / "raw", {"validation": ["Gamma", "Delta"]})
    lines = (tmp_path / "raw" / "wiki.valid.raw").read_text().splitlines(keepends=True)
    hub = tmp_path / "hub" / "wikitext-103-raw-v1"
    hub.mkdir(parents=True)
    pq.write_table(pa.table({"text": lines}), hub / "validation-00000-of-00001.parquet")
    assert np.array_equal(load_split(str(tmp_path / "raw"), "validation"),
                          load_split(str(tmp_path / "hub"), "validation"))


def test_tokens_are_cached_by_content_not_place(tmp_path, monkeypatch):
    write_raw_folder(tmp_path / "wt", {"validation": ["Gamma"]})
    first = np.array(load_split(str(tmp_path / "wt"), "validation"))
    real_tokenize = token_files.tokenize_pass
    monkeypatch.setattr(token_files, "tokenize_pass", lambda *a: pytest.fail("re-tokenized a cached split"))
    (tmp_path / "wt").rename(tmp_path / "moved")
    os.utime(tmp_path / "moved" / "wiki.valid.raw")  # touched: same content
    assert np.array_equal(first, load_split(str(tmp_path / "moved"), "validation"))
    monkeypatch.setattr(token_files, "tokenize_pass", real_tokenize)
    write_raw_folder(tmp_path / "moved", {"validation": ["Delta"]})  # new content, same size
    assert not np.array_equal(first, load_split(str(tmp_path / "moved"), "validation"))


def test_damaged_token_file_is_reported(tmp_path):
    path = tmp_path / "t.bin"
    write_tokens(path, np.arange(100, dtype=np.uint16))
    assert np.array_equal(read_tokens(path), np.arange(100))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match="truncated"):
        read_tokens(path)
    path.write_bytes(b"\0" * 2048)
    with pytest.raises(ValueError, match="bad magic"):
        read_tokens(path)


def test_bad_dataset_files_are_named_errors(tmp_path):
    write_raw_folder(tmp_path / "wt", {"train": ["Alpha"]})
    (tmp_path / "wt" / "wiki.valid.raw").write_bytes(b" = Gamma = \n caf\xe9 \n")
    (tmp_path / "wt" / "wiki.test.raw").mkdir()
    for split in ("train", "test"):  # a file that cannot be read stops every split's read, before any text is read
        with pytest.raises(DatasetError, match=r"wiki.test.raw is not a file but a folder"):
            load_split(str(tmp_path / "wt"), split)
    (tmp_path / "wt" / "wiki.test.raw").rmdir()
    with pytest.raises(DatasetError, match=r"wiki.valid.raw is not UTF-8: byte 0xe9 at offset 16 \(line 2\)"):
        load_split(str(tmp_path / "wt"), "validation")
    from bench.eval.scorecard import text_file_corpus  # --eval-text reads through the same check
    with pytest.raises(DatasetError, match=r"wiki.valid.raw is not UTF-8"):
        text_file_corpus(tmp_path / "wt" / "wiki.valid.raw")


def test_bad_parquet_files_are_named_errors(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "validation-00000-of-00001.parquet").write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match=r"validation-00000-of-00001.parquet is not a readable parquet file"):
        load_split(str(tmp_path / "junk"), "validation")
    (tmp_path / "ints").mkdir()
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "ints" / "validation-00000-of-00001.parquet")
    with pytest.raises(DatasetError, match=r"the \"text\" column holds int64, not strings"):
        load_split(str(tmp_path / "ints"), "validation")


def test_unknown_dataset_names_alternatives():
    with pytest.raises(DatasetError, match="neither a known name.*wikitext-103.*builtin"):
        get_corpus("/no/such/folder")


def test_unreachable_hub_error_names_alternatives(monkeypatch):
    import datasets
    monkeypatch.setattr(hub_access, "hub_reachable", lambda: True)  # the hub answers, then the load fails
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: (_ for _ in ()).throw(ConnectionError("offline")))
    with pytest.raises(DatasetError, match="local folder.*--dataset builtin"):
        list(get_corpus("wikitext-103").documents("validation"))


@pytest.fixture
def no_network(monkeypatch):
    """Every attempt to open a connection (or resolve a name) is recorded and refused."""
    import socket
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(corpus, "HUB_REPO", "no-such-org/not-in-any-cache")
    return attempts


def test_offline_variable_reads_the_cache_without_touching_the_network(monkeypatch, no_network):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DatasetError, match=r"(?s)from its cache \(offline: HF_HUB_OFFLINE or HF_DATASETS_OFFLINE "
                                           r"is set\).*--dataset PATH.*--dataset builtin"):
        list(get_corpus("wikitext-2").documents("validation"))
    assert no_network == []


def test_an_unreachable_hub_is_asked_once_then_only_the_cache_is_read(monkeypatch, no_network):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    import datasets.config
    from huggingface_hub import constants
    modes = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    with pytest.raises(DatasetError, match=r"(?s)from its cache \(offline: .* did not answer\).*--dataset builtin"):
        list(get_corpus("wikitext-2").documents("validation"))
    assert len(no_network) == 1  # the probe; the load itself made no request
    assert (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE) == modes  # restored afterwards


def test_builtin_corpus_is_named_for_what_it_is():
    corpus = builtin_corpus()
    assert "wiki" not in corpus.name and "python-stdlib-docs" in corpus.text_pass("validation").key
    doc = next(corpus.documents("validation"))
    assert isinstance(doc, str) and len(doc) > 0
    counted = []  # the progress bar and the "MB/s of text" line count what the pass read
    documents = [doc for _, doc in corpus.text_pass("validation").read(counted.append)]
    assert sum(counted) == sum(len(d) for d in documents) > 0


def test_eval_batches_cover_every_target_once():
    tokens = np.arange(1000, dtype=np.uint16)
    targets = torch.cat([y[y != -1] for _, y in eval_batches(tokens, block_size=64, batch_size=3)])
    assert torch.equal(targets, torch.arange(1, 1000))
    limited = list(eval_batches(tokens, block_size=64, batch_size=3, max_batches=2))
    assert len(limited) == 2 and torch.equal(limited[0][0], next(eval_batches(tokens, 64, 3))[0])


def test_sampler_ranks_split_the_global_batch_and_resume_exactly():
    tokens = np.arange(5000, dtype=np.uint16)
    single = WindowSampler(tokens, 16, batch_size=4, seed=3)
    ranks = [WindowSampler(tokens, 16, batch_size=2, seed=3, dp_rank=r, dp_size=2) for r in range(2)]
    for _ in range(200):  # crosses several epochs
        x, y = single.next_batch()
        parts = [s.next_batch() for s in ranks]
        assert torch.equal(x, torch.cat([p[0] for p in parts]))
        assert torch.equal(y, x + 1)  # targets are the next tokens
    resumed = WindowSampler(tokens, 16, batch_size=4, seed=3)
    resumed.load_state_dict(single.state_dict())
    assert torch.equal(resumed.next_batch()[0], single.next_batch()[0])


def test_epochs_reshuffle_deterministically():
    tokens = np.arange(5000, dtype=np.uint16)
    a, b = WindowSampler(tokens, 16, 4, seed=1), WindowSampler(tokens, 16, 4, seed=1)
    a.set_epoch(1)
    b.set_epoch(1)
    assert torch.equal(a.next_batch()[0], b.next_batch()[0])
    b.set_epoch(2)
    a.set_epoch(1)
    assert not torch.equal(a.next_batch()[0], b.next_batch()[0])


def test_tiny_split_is_refused_with_fix():
    with pytest.raises(ValueError, match="too few.*--block-size"):
        WindowSampler(np.arange(10, dtype=np.uint16), 16, 2)


# --- streaming, formats, carving, the cache and once-per-job tokenizing --------------------------------

PARAGRAPH = "Line {i} of a text without headings , as most corpora are .\nIt goes on .\n\n"


def gpt2_tokens(documents):
    """tiktoken's own encoding of the documents, each followed by end-of-text."""
    encoder = token_files.get_tokenizer()
    return np.array([t for doc in documents for t in encoder.encode_ordinary(doc) + [50256]], dtype=np.uint16)


def test_headingless_text_becomes_bounded_documents_whatever_the_pieces():
    from data.documents import cut_documents
    text = "".join(PARAGRAPH.format(i=i) for i in range(400)) + "x" * 3000 + "\n"  # and one line over the bound
    whole = list(cut_documents([text], max_chars=1000))
    assert len(whole) > 20 and max(map(len, whole)) <= 1000
    assert "".join(whole) == text[:-1]  # all of it, but for a last "document" of blanks alone
    assert all(doc.endswith("\n\n") for doc in whole[:-5])  # cut after a blank line where there is one
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.integers(0, len(text), 30))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert list(cut_documents(pieces, max_chars=1000)) == whole  # reading in other pieces cuts the same


def test_text_jsonl_and_parquet_give_the_tokens_of_their_documents(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    articles = [ARTICLE.format(title=t) for t in ("Alpha", "Beta", "Gamma")] + ["A record without a heading ."]
    for name in ("txt", "jsonl", "parquet"):
        (tmp_path / name).mkdir()
    (tmp_path / "txt" / "train.txt").write_text("".join(articles[:3]))
    (tmp_path / "txt" / "train_more.txt").write_text(articles[3])  # a file ends its document
    with open(tmp_path / "jsonl" / "train.jsonl", "w") as f:
        f.writelines(json.dumps({"text": a, "id": i}) + "\n" for i, a in enumerate(articles))
    pq.write_table(pa.table({"text": articles}), tmp_path / "parquet" / "train-00000-of-00001.parquet")
    (tmp_path / "txt" / "valid.txt").write_text("Held out .")  # so nothing is carved from the training text
    (tmp_path / "jsonl" / "validation.jsonl").write_text(json.dumps({"text": "Held out ."}))
    pq.write_table(pa.table({"text": ["Held out ."]}), tmp_path / "parquet" / "validation-00000-of-00001.parquet")
    expected = gpt2_tokens(articles)
    for name in ("txt", "jsonl", "parquet"):
        assert np.array_equal(load_split(str(tmp_path / name), "train"), expected), name


def test_bad_jsonl_lines_are_named(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"text": "fine"}\n{"text": 3}\n')
    with pytest.raises(DatasetError, match=r"train.jsonl line 2 has no \"text\" field holding a string"):
        load_split(str(tmp_path / "train.jsonl"), "train")
    (tmp_path / "train.jsonl").write_text('{"text": "fine"}\nnot json\n')
    with pytest.raises(DatasetError, match=r"train.jsonl line 2 is not a JSON object"):
        load_split(str(tmp_path / "train.jsonl"), "train")


def test_a_corpus_without_validation_has_it_carved_from_training_text(tmp_path, capsys):
    from data.local_files import CARVE_EVERY, local_corpus, size_text
    docs = [f"Document number {i} says something of its own .\n" for i in range(3 * CARVE_EVERY)]
    text = "".join(json.dumps({"text": d}) + "\n" for d in docs)
    (tmp_path / "corpus.jsonl").write_text(text)
    splits = {s: load_split(str(tmp_path / "corpus.jsonl"), s) for s in ("train", "validation", "test")}
    printed = capsys.readouterr().err
    assert f"data: local:{tmp_path / 'corpus.jsonl'} validation: {len(splits['validation']):,} tokens (tokenized " \
           f"now) from corpus.jsonl ({size_text(len(text))}), carved out of the training text: every 200th passage " \
           f"from a seeded offset (0.5%) is held out, so the model is measured on text it does not train on (a " \
           f"passage is a record, i.e. a JSON line or parquet row, or an article, and in plain text a stretch " \
           f"ending at a paragraph break, none longer than 4,096 characters; the files are not changed)\n" in printed
    assert len(splits["validation"]) and len(splits["test"])
    corpus = local_corpus(tmp_path / "corpus.jsonl")
    carved = {s: list(corpus.documents(s)) for s in splits}
    assert len(carved["validation"]) == len(carved["test"]) == 3  # every 200th document
    assert sorted(d for s in carved.values() for d in s) == sorted(docs)  # each document in exactly one split
    for split, tokens in splits.items():
        assert np.array_equal(tokens, gpt2_tokens(carved[split]))
    (tmp_path / "small.txt").write_text("".join(PARAGRAPH.format(i=i) for i in range(3)))
    assert len(load_split(str(tmp_path / "small.txt"), "validation"))  # too small to carve: its last document


def test_an_interrupted_tokenizer_leaves_no_file_that_looks_whole(tmp_path, monkeypatch):
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / "train.txt").write_text("".join(PARAGRAPH.format(i=i) for i in range(2000)))
    monkeypatch.setattr(token_files, "BATCH_CHARS", 4096)
    calls = []

    def dies_on_the_fifth_task(docs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_encode(docs)
    real_encode = token_files.encode_documents
    monkeypatch.setattr(token_files, "encode_documents", dies_on_the_fifth_task)
    with pytest.raises(KeyboardInterrupt):
        load_split(str(tmp_path / "wt"), "train")
    folder = next((tmp_path / "cache").iterdir())
    assert not list(folder.glob("*.bin*"))  # neither a token file nor its partial
    (folder / "train.bin.partial").write_bytes(b"left by a writer that was killed")
    (folder / "validation.bin.tmp1234").write_bytes(b"left by an earlier version")
    monkeypatch.setattr(token_files, "encode_documents", real_encode)
    tokens = load_split(str(tmp_path / "wt"), "train")
    assert len(tokens) and sorted(p.name for p in folder.glob("*.bin*")) == ["test.bin", "train.bin", "validation.bin"]


def test_a_hub_dataset_repository_streams_from_the_hub_cache_offline(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "hub" / "datasets--someone--webtext"
    snapshot = repo / "snapshots" / ("1" * 40) / "plain_text"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("1" * 40)
    docs = [f"Web page {i} .\nWith a second paragraph .\n" for i in range(450)]
    pq.write_table(pa.table({"text": docs}), snapshot / "train-00000-of-00001.parquet")
    train = load_split("hf:someone/webtext", "train")
    assert np.array_equal(load_split("someone/webtext", "validation"),
                          gpt2_tokens(get_corpus("hf:someone/webtext/plain_text").documents("validation")))
    assert len(train) > 50 * len(load_split("someone/webtext", "validation")) > 0
    with pytest.raises(DatasetError, match=r"could not load the dataset repository 'someone/elsewhere' from the "
                                           r"hub's cache \(offline"):
        load_split("hf:someone/elsewhere", "train")


def _tokenize_on_two_ranks(rank: int, port: int, dataset: str, cache: str, log: str) -> None:
    import datetime
    import torch.distributed as dist
    from parallel.dims import ParallelDims
    from parallel.distributed import DistContext, run_on_node_leader
    os.environ.update(GPT2_DATA_CACHE=cache, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    real = token_files.tokenize_pass

    def logged(*args):
        with open(log, "a") as f:
            f.write(f"rank {rank}\n")
        real(*args)
    token_files.tokenize_pass = logged
    ctx = DistContext(ParallelDims(dp_replicate=2), rank=rank, procs_per_node=2)
    run_on_node_leader(ctx, lambda: token_files.prepare_split(dataset, "train"), "tokenize")
    assert len(load_split(dataset, "train")) > 0
    dist.destroy_process_group()


def test_two_ranks_tokenize_once(tmp_path):
    import socket
    import torch.multiprocessing as mp
    write_raw_folder(tmp_path / "wt", {"train": ["Alpha", "Beta"]})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_tokenize_on_two_ranks, args=(port, str(tmp_path / "wt"), str(tmp_path / "c"), str(tmp_path / "log")),
             nprocs=2, join=True)
    assert (tmp_path / "log").read_text() == "rank 0\n"


def test_every_run_says_each_splits_tokens_and_files_whether_tokenized_or_cached(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPT2_DATA_CACHE", str(tmp_path / "cache"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "train.txt").write_text("Lamps and ropes .\n" * 50)
    (tmp_path / "notes" / "valid.txt").write_text("Held out .\n")
    dataset = str(tmp_path / "notes")
    tokens = len(load_split(dataset, "validation"))
    line = f"data: local:{tmp_path / 'notes'} validation: {tokens:,} tokens ({{}}) from valid.txt (11 bytes)\n"
    assert capsys.readouterr().err.endswith(line.format("tokenized now"))
    monkeypatch.setattr(token_files, "TOKENIZED_HERE", set())  # as a later run, which finds the cache
    load_split(dataset, "validation")
    assert capsys.readouterr().err == line.format("read from the cache")


def test_the_readme_table_of_formats_is_the_one_the_help_is_written_from():
    from data.corpus import DATASET_FORMATS, formats_table
    from training.config import TrainConfig
    assert formats_table() in (Path(__file__).parent.parent / "docs" / "data.md").read_text()
    [dataset] = [f for f in dataclasses.fields(TrainConfig) if f.name == "dataset"]
    assert all(f"{form}: {what}" in dataset.metadata["help"] for form, what in DATASET_FORMATS)
