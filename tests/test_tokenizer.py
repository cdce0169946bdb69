import pytest

from data import tokenizer
from data.tokenizer import TokenizerError, encoding_from_file, get_tokenizer


def test_gpt2_ids():
    enc = get_tokenizer()
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.eot_token == 50256
    assert enc.n_vocab == 50257
    assert enc.decode(enc.encode_ordinary("It's 2026, déjà vu!")) == "It's 2026, déjà vu!"


def test_wrong_ranks_file_is_refused_with_fix(tmp_path):
    bad = tmp_path / "gpt2.tiktoken"
    bad.write_bytes(b"aGVsbG8= 0\n")
    with pytest.raises(TokenizerError, match="not GPT-2's ranks file.*fetch_tokenizer"):
        encoding_from_file(bad)


def test_missing_env_file_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("GPT2_TIKTOKEN_FILE", str(tmp_path / "nope.tiktoken"))
    with pytest.raises(TokenizerError, match="nope.tiktoken does not exist.*fetch_tokenizer"):
        tokenizer.ranks_file()


def test_offline_without_file_says_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(tokenizer, "DEFAULT_RANKS_FILE", tmp_path / "absent.tiktoken")
    monkeypatch.delenv("GPT2_TIKTOKEN_FILE", raising=False)
    # An empty tiktoken cache and an unreachable host: tiktoken's own path must fail cleanly.
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tokenizer.tiktoken, "get_encoding",
                        lambda name: (_ for _ in ()).throw(ConnectionError("no network")))
    tokenizer.get_tokenizer.cache_clear()
    try:
        with pytest.raises(TokenizerError, match="not available.*fetch_tokenizer"):
            tokenizer.get_tokenizer()
    finally:
        tokenizer.get_tokenizer.cache_clear()
