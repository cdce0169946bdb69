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


def test_fetch_tokenizer_fills_tiktokens_own_cache_for_offline_use(tmp_path):
    """tiktoken's gpt2 (vocab.bpe + encoder.json, rebuilt from the ranks) and r50k_base encodings load from the
    filled cache with no network, pass tiktoken's hash checks and equal the project's tokenizer."""
    import json
    import os
    import subprocess
    import sys
    if tokenizer.ranks_file() is None:
        pytest.skip("no ranks file: run `python -m data.fetch_tokenizer` (or `make setup`) first")
    cache = tmp_path / "tiktoken-cache"
    # A proxy that refuses every connection: any download attempt fails instead of reaching the network.
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache), "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9"}
    fetch = subprocess.run([sys.executable, "-m", "data.fetch_tokenizer", "--dest", str(tokenizer.ranks_file())],
                           capture_output=True, text=True, env=env, timeout=120)
    assert fetch.returncode == 0 and f"to {cache}" in fetch.stdout, fetch.stderr
    text = "It's 2026, déjà vu! \u2028 naïve 東京 <|endoftext|>   \n\n\tcode()"
    script = ("import json, sys, tiktoken\n"
              "encs = [tiktoken.get_encoding('gpt2'), tiktoken.get_encoding('r50k_base'), "
              "tiktoken.encoding_for_model('gpt2')]\n"
              "print(json.dumps([e.encode_ordinary(sys.argv[1]) for e in encs] + [e.n_vocab for e in encs]))\n")
    # Outside the project (no data/ on the path): a plain tiktoken client.
    result = subprocess.run([sys.executable, "-c", script, text], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    *encodings, n1, n2, n3 = json.loads(result.stdout)
    expected = get_tokenizer().encode_ordinary(text)
    assert encodings == [expected] * 3 and (n1, n2, n3) == (50257, 50257, 50257)
