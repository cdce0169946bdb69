"""bench/peers/llama_cpp_peer.py: GPT-2's tokenizer rebuilt in the form GGUF files carry it (always checked), and
llama.cpp's greedy tokens on our weights written as GGUF (only where gguf and llama-cpp-python are installed;
CI has neither: pip builds llama.cpp from source)."""
import pytest
import torch

from bench.peers.llama_cpp_peer import EOT, byte_symbols, merges_from_ranks
from data.tokenizer import get_tokenizer


def test_merges_rebuild_every_gpt2_token_from_two_older_ones():
    encoding = get_tokenizer()
    ranks = {encoding.decode_single_token_bytes(i): i for i in range(EOT)}
    merges = merges_from_ranks(ranks)
    assert len(merges) == EOT - 256  # GPT-2's merges file has 50,000 lines
    assert merges[0] == (b" ", b"t")  # its first line: "Ġ t"
    made = [a + b for a, b in merges]
    assert sorted(made, key=ranks.get) == made and set(made) == {t for t in ranks if len(t) > 1}
    assert all(ranks[a] < ranks[a + b] and ranks[b] < ranks[a + b] for a, b in merges)


def test_byte_symbols_are_gpt2s_printable_alphabet():
    symbols = byte_symbols()
    assert len(set(symbols.values())) == 256
    assert symbols[ord(" ")] == "Ġ" and symbols[ord("\n")] == "Ċ" and symbols[ord("A")] == "A"


def test_llama_cpp_decodes_our_weights(tmp_path):
    pytest.importorskip("gguf")
    pytest.importorskip("llama_cpp")
    from bench.peers.llama_cpp_peer import LlamaCppDecoder, gguf_files
    from decode.generate import generate
    from model.gpt import GPT
    from decode.sampling import SamplingParams
    from tests.conftest import small_config
    torch.manual_seed(0)
    model = GPT(small_config()).eval()
    files = gguf_files(model, tmp_path)
    f32 = LlamaCppDecoder.load(files["F32"], threads=1, context=64, rows=3)
    for rows in (1, 3, 2):  # several sequences in one context; a later call with fewer rows starts clean
        prompt = torch.randint(0, model.config.vocab_size, (rows, 6))
        ours = generate(model, prompt, SamplingParams(max_new_tokens=8, temperature=0, stop_at_eot=False))
        assert torch.equal(f32.generate(prompt, 8), ours)
    q8 = LlamaCppDecoder.load(files["Q8_0"], threads=1, context=64).generate(prompt[:1], 8)
    assert q8.shape == (1, 14) and torch.equal(q8[:, :6], prompt[:1])
    import gguf
    matrices = {t.name: t.tensor_type for t in gguf.GGUFReader(tmp_path / "model.q8_0.gguf").tensors
                if t.name.startswith("blk.") and t.name.endswith(".weight") and len(t.shape) == 2}
    assert len(matrices) == 4 * model.config.n_layer and set(matrices.values()) == {gguf.GGMLQuantizationType.Q8_0}
