"""What only a GPU can show (the `cuda` marker): these run whenever CUDA is present and are skipped otherwise.

Tolerances, stated: bf16 autocast training stays within 2% of fp32's loss at every logged step of a 20-step
run; resume on CUDA in fp32 equals the uninterrupted run within 1e-4 relative (CUDA's backward for the
embedding accumulates with atomics, so bitwise equality is not promised); one NCCL rank of ddp, fsdp and tp
equals `--parallel none` within 1e-4 relative in fp32.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

REPO = Path(__file__).resolve().parent.parent
FAST = dict(model="tiny", dataset="builtin", device="cuda", curves=False, batch_size=4, block_size=64, log_interval=5,
            eval_batches=2, final_eval_batches=2, warmup_steps=5, lr=2e-3)


def losses(out_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_bf16_training_falls_and_tracks_fp32(tmp_path):
    import train
    for precision in ("fp32", "bf16"):
        train.train(train.TrainConfig(**FAST, max_steps=20, eval_interval=100, precision=precision,
                                      out_dir=str(tmp_path / precision)))
    fp32, bf16 = losses(tmp_path / "fp32"), losses(tmp_path / "bf16")
    assert bf16[20] < bf16[5]
    for step, value in fp32.items():
        assert bf16[step] == pytest.approx(value, rel=0.02), step


def test_resume_on_cuda_continues_the_run(tmp_path, monkeypatch):
    import train
    from tests.conftest import interrupt_training_at_batch
    config = dict(**FAST, max_steps=10, eval_interval=5, precision="fp32")
    train.train(train.TrainConfig(**config, out_dir=str(tmp_path / "full")))
    undo = interrupt_training_at_batch(monkeypatch, 8)
    with pytest.raises(SystemExit):
        train.train(train.TrainConfig(**config, out_dir=str(tmp_path / "broken")))
    undo()
    train.train(train.TrainConfig(**config, out_dir=str(tmp_path / "broken"), resume="yes"))
    assert losses(tmp_path / "broken")[10] == pytest.approx(losses(tmp_path / "full")[10], rel=1e-4)


@pytest.mark.parametrize("mode", ["ddp", "fsdp", "tp"])
def test_one_nccl_rank_equals_one_device(tmp_path, mode):
    def run(out, *extra):
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                   str(REPO / "train.py"), "--model", "tiny", "--device", "cuda", "--precision", "fp32",
                   "--block-size", "64", "--batch-size", "4", "--max-steps", "6", "--log-interval", "1",
                   "--eval-interval", "100", "--final-eval-batches", "1", "--out-dir", str(out), *extra]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600,
                                # the repo first, then whatever path the caller had (a machine whose packages
                                # sit beside the interpreter's, as on the lent GPU image, needs it kept)
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                    [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])})
        assert result.returncode == 0, result.stderr[-2000:]
        return losses(out)
    reference = run(tmp_path / "none")
    assert run(tmp_path / mode, "--parallel", mode) == pytest.approx(reference, rel=1e-4)


def test_kv_cache_generation_equals_uncached_on_cuda(small_model):
    from decode.generate import generate
    from decode.sampling import SamplingParams
    model = small_model.cuda()
    prompt = torch.randint(0, 50257, (3, 5), device="cuda")
    params = SamplingParams(max_new_tokens=12, temperature=0, stop_at_eot=False)
    assert torch.equal(generate(model, prompt, params, use_cache=True), generate(model, prompt, params, use_cache=False))


def test_cuda_graph_decoding_gives_the_tokens_of_eager_decoding(small_model):
    """Greedy tokens of decode steps replayed as one captured CUDA graph equal eager decoding's, at batch 1
    and 3, and a second call (a new graph for a new cache) agrees too."""
    from decode.generate import generate
    from decode.sampling import SamplingParams
    model = small_model.cuda()
    params = SamplingParams(max_new_tokens=20, temperature=0, stop_at_eot=False)
    for batch in (1, 3):
        prompt = torch.randint(0, 50257, (batch, 5), device="cuda")
        eager = generate(model, prompt, params, decode="dynamic")
        assert torch.equal(generate(model, prompt, params, decode="cuda-graph"), eager)
        assert torch.equal(generate(model, prompt, params, decode="cuda-graph"), eager)


def test_an_int8_artifact_runs_weight_only_on_cuda(tmp_path, small_model):
    import copy

    from model.int8 import quantize_model
    from runtime.provenance import provenance
    from storage.artifact import int8_artifact_writers, load_model, write_folder_atomically
    quantized = copy.deepcopy(small_model)
    quantization = quantize_model(quantized, head="fp32")
    write_folder_atomically(tmp_path / "int8", int8_artifact_writers(quantized, provenance("tests"), quantization))
    with pytest.warns(UserWarning):
        model, meta = load_model(tmp_path / "int8", "cuda")
        idx = torch.randint(0, 50257, (2, 8), device="cuda")
        logits, _ = model(idx)
    reference, _ = small_model.cuda()(idx)
    assert meta.kind == "int8" and logits.device.type == "cuda"
    assert float((logits - reference).abs().max()) < 0.05 * float(reference.abs().max())


def test_the_server_answers_on_cuda(small_artifact):
    from fastapi.testclient import TestClient

    from serve.app import create_app
    from serve.config import ServeConfig
    with TestClient(create_app(ServeConfig(checkpoint=small_artifact, device="cuda"))) as client:
        reply = client.post("/generate", json={"prompt": "Hello", "max_new_tokens": 4, "temperature": 0})
        assert reply.status_code == 200 and reply.json()["tokens"] >= 1
        assert client.get("/health").json()["device"].startswith("cuda")


def test_the_server_engine_decodes_through_captured_graphs_to_the_eager_tokens(small_model):
    """The engine's steps captured per padded row count (rows at their own lengths, joining and leaving) give the
    tokens of its eager steps; so do speculative passes captured per row count and width."""
    from decode.generate import generate
    from decode.sampling import SamplingParams
    from serve.engine import Engine
    from tests.test_serve_engine import mixed_jobs, run
    model = small_model.cuda()
    jobs = [(ids, SamplingParams(max_new_tokens=12, temperature=0, stop_at_eot=False)) for ids, _ in mixed_jobs(7, 32)]
    texts = {}
    for decode in ("dynamic", "cuda-graph"):
        engine = Engine(model, torch.device("cuda"), max_batch_size=6, max_queue=32, request_timeout_s=120,
                        decode=decode)
        engine.warm_up()
        engine.start()
        try:
            texts[decode] = run(engine, jobs).ends
        finally:
            engine.stop()
    assert [texts["cuda-graph"][i].text for i in range(7)] == [texts["dynamic"][i].text for i in range(7)]
    params = SamplingParams(max_new_tokens=16, temperature=0, stop_at_eot=False)
    prompt = torch.randint(0, 50257, (3, 5), device="cuda")
    assert torch.equal(generate(model, prompt, params, draft=model, decode="cuda-graph"),
                       generate(model, prompt, params, decode="dynamic"))


def test_steps_launched_ahead_on_cuda_give_the_events_of_steps_read_back_and_wait_for_no_kernel():
    """The default on a GPU: captured steps launched ahead give each request (alone: one row, the same captures)
    the events of steps read back one at a time, sampling, penalties, biases and log-probabilities included; and a
    running batch's step reads nothing back and copies nothing from pageable memory (torch's sync debug mode
    raises on either), so the thread only waits for the event after the step before's tokens."""
    from decode.sampling import SamplingParams
    from model.gpt import GPT
    from serve.engine import Engine
    from serve.events import GenerationRequest
    from tests.conftest import small_config
    from tests.test_serve_async import BLOCK_SIZE, mixed_jobs, prompt, serve
    torch.manual_seed(0)
    model = GPT(small_config(block_size=BLOCK_SIZE, vocab_size=2048)).cuda().eval()
    jobs = [*mixed_jobs(), dict(prompt_ids=prompt(5, 8), params=SamplingParams(max_new_tokens=9, temperature=0.8,
                                                                                 seed=9), logprobs=3)]
    for job in jobs:
        off, _ = serve(model, [job], "off", decode="cuda-graph", device="cuda")
        on, _ = serve(model, [job], "on", decode="cuda-graph", device="cuda")
        assert on.events == off.events
    engine = Engine(model, torch.device("cuda"), max_batch_size=4, max_queue=4, request_timeout_s=120,
                    decode="cuda-graph")
    runner = engine.runner
    assert runner.launch_ahead  # auto, on a GPU
    settings = [dict(temperature=0), dict(temperature=0.9, top_k=40, seed=1),
                dict(temperature=0.7, seed=2, presence_penalty=1.0, logit_bias=((5, 2.0),))]
    with torch.inference_mode():
        for i, extra in enumerate(settings):
            runner.join_together([GenerationRequest(prompt(3 + i, i), SamplingParams(max_new_tokens=20, **extra),
                                                    lambda event: None, logprobs=2 if i == 2 else None)])
        for _ in range(3):  # the step's first run and its capture; then the batch's views are current
            runner.step()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(5):
                runner.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert len(runner.active) == 3 and all(seq.row.generated == 1 + 7 for seq in runner.active)
