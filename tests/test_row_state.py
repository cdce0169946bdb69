"""A row's life has one owner (decode/row_state.py): generate(), speculative decoding and the server's engine end
the same rows at the same tokens for the same reasons; and the server's classes stay small."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from data.tokenizer import decode
from decode.generate import generate
from model.gpt import GPT
from decode.row_state import RowState
from decode.sampling import SamplingParams
from serve.engine import Engine
from serve.events import GenerationRequest
from tests.conftest import small_config
from tests.test_serve_engine import Collector

NEW_TOKENS = 12


def ends_in_three_paths(model: GPT, prompts: torch.Tensor, params: SamplingParams, stops: list[list[str]]):
    """(tokens, finish reason, tokens generated) per row: from generate(), from speculative decoding (the model
    drafting for itself), and from the engine, each row a request of its own."""
    paths = {}
    for name, draft in (("generate", None), ("speculative", model)):
        rows = [RowState(params, stop) for stop in stops]
        generate(model, prompts, params, decode="dynamic", draft=draft, draft_tokens=3, rows=rows)
        paths[name] = [(row.tokens, row.finish_reason, row.generated) for row in rows]
    engine = Engine(model, torch.device("cpu"), max_batch_size=len(stops), max_queue=4, request_timeout_s=60,
                    decode="dynamic")
    engine.start()
    try:
        collector = Collector(len(stops))
        for i, (prompt, stop) in enumerate(zip(prompts.tolist(), stops)):
            engine.submit(GenerationRequest(prompt, params, collector.callback(i), stop=stop))
        collector.wait()
    finally:
        engine.stop()
    paths["server"] = [(collector.tokens[i], collector.ends[i].finish_reason, collector.ends[i].tokens)
                       for i in range(len(stops))]
    return paths


def test_generate_speculative_decoding_and_the_server_end_rows_alike(monkeypatch):
    torch.manual_seed(0)
    model = GPT(small_config()).eval()
    with torch.no_grad():  # weights far from their small initial ones: greedy tokens vary instead of repeating
        for weight in (p for p in model.parameters() if p.dim() == 2):
            weight.normal_(0, 0.5)
    prompts = torch.randint(0, 50257, (3, 5), generator=torch.Generator().manual_seed(2))
    greedy = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0)
    free = generate(model, prompts, SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0, stop_at_eot=False),
                    decode="dynamic")[:, 5:].tolist()
    # Row 0 ends at a stop string: the text of its greedy token 5 (the first piece of text made of whole
    # characters that shows up there).  Row 1 ends at "end-of-text": its token 7 made the end-of-text token (the
    # rule lives in RowState alone, so the patch reaches all three paths).  Row 2 runs to its length.
    stop = decode(free[0][5:6])
    assert stop.strip() and "\ufffd" not in stop
    end_token = free[1][7]
    assert end_token not in free[0][:6] + free[1][:7] + free[2]
    monkeypatch.setattr("decode.row_state.EOT_TOKEN", end_token)
    paths = ends_in_three_paths(model, prompts, greedy, [[stop], [], []])

    assert [reason for _, reason, _ in paths["generate"]] == ["stop", "eos", "length"]
    first_stop = next(i for i in range(NEW_TOKENS) if stop in decode(free[0][:i + 1]))
    assert paths["generate"][0][0] == free[0][:first_stop + 1]
    assert paths["generate"][1] == (free[1][:7], "eos", 8)  # end-of-text is generated, not output
    assert paths["generate"][2] == (free[2], "length", NEW_TOKENS)
    assert paths["speculative"] == paths["generate"]
    assert paths["server"] == paths["generate"]


def test_a_row_takes_no_token_after_its_end_and_none_when_asked_for_none():
    row = RowState(SamplingParams(max_new_tokens=2, temperature=0))
    assert row.accept_all([5, 6, 7]) == 2 and row.tokens == [5, 6] and row.finish_reason == "length"
    with pytest.raises(RuntimeError, match="already ended"):
        row.accept(8)
    assert RowState(SamplingParams(max_new_tokens=0)).finished


def test_no_class_in_the_server_has_more_than_twelve_methods():
    for path in Path("serve").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = [f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
                assert len(methods) <= 12, f"{path}: {node.name} has {len(methods)} methods"
