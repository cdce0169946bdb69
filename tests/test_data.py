import numpy as np
import pytest
import torch

from data import corpus, hub_access, shards
from data.corpus import DatasetError, builtin_corpus, get_corpus, split_articles
from data.loader import WindowSampler, eval_batches
from data.shards import load_split, read_tokens, write_tokens

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


def test_tokens_are_cached_and_reused(tmp_path, monkeypatch):
    write_raw_folder(tmp_path / "wt", {"validation": ["Gamma"]})
    first = np.array(load_split(str(tmp_path / "wt"), "validation"))
    monkeypatch.setattr(shards, "tokenize_split", lambda *a: pytest.fail("re-tokenized a cached split"))
    assert np.array_equal(first, load_split(str(tmp_path / "wt"), "validation"))


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
    with pytest.raises(DatasetError, match=r"wiki.valid.raw is not UTF-8: byte 0xe9 at offset 16 \(line 2\)"):
        load_split(str(tmp_path / "wt"), "validation")
    with pytest.raises(DatasetError, match=r"wiki.test.raw is not a file"):
        load_split(str(tmp_path / "wt"), "test")
    from bench.leaderboard import text_file_corpus  # --eval-text reads through the same check
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
    assert "wiki" not in corpus.name and "python-stdlib-docs" in corpus.fingerprint
    doc = next(corpus.documents("validation"))
    assert isinstance(doc, str) and len(doc) > 0


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
