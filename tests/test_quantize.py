"""Dynamic int8 quantization: closeness to float, artifact round trip, clear errors, the CLI end to end."""
from __future__ import annotations

import copy
import json
import re
import shutil

import pytest
import torch
import torch.nn.functional as F

import sample
from decode.generate import generate
from model.gpt import GPT
from model.int8 import (HEAD_FORMATS, Fp16WeightLinear, Int8Embedding, Int8Linear,
                        quantize_model, quantize_per_channel)
from decode.sampling import SamplingParams
from quantize import dynamic
from quantize.measure import greedy_agreement
from runtime.provenance import provenance
from storage.artifact import (CONFIG_FILE, WEIGHTS_FILE, ArtifactError, artifact_writers, int8_artifact_writers,
                            load_model, save_artifact, write_folder_atomically)
from storage.int8_weights import int8_state_for_saving
from tests.conftest import small_config

VOCAB = 256


def successor_batch(batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """Sequences where each token determines the next (t -> 5t + 3 mod VOCAB), so a model can learn them."""
    start = torch.randint(0, VOCAB, (batch, 1), generator=generator)
    steps = [start]
    for _ in range(length):
        steps.append((steps[-1] * 5 + 3) % VOCAB)
    return torch.cat(steps, dim=1)


@pytest.fixture(scope="module")
def trained_model() -> GPT:
    """A small model trained until its predictions are confident, as a real checkpoint's are."""
    torch.manual_seed(0)
    model = GPT(small_config(n_embd=64, vocab_size=VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        seq = successor_batch(16, 32, generator)
        _, loss = model(seq[:, :-1], seq[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def quantized(model: GPT, head: str = "fp32") -> tuple[GPT, dict]:
    copy_ = copy.deepcopy(model)
    return copy_, quantize_model(copy_, head=head)


def save_int8(folder, model: GPT, quantization: dict) -> None:
    write_folder_atomically(folder, int8_artifact_writers(model, provenance("tests"), quantization))


def test_per_channel_quantization_error_is_bounded_by_half_a_step():
    weight = torch.randn(8, 16) * torch.logspace(-3, 1, 8)[:, None]  # rows of very different sizes
    weight[3] = 0  # a fully pruned row must survive
    q, scale = quantize_per_channel(weight)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    error = (q.float() * scale[:, None] - weight).abs()
    assert bool((error <= scale[:, None] / 2 + 1e-7).all())
    assert bool((q[3] == 0).all())


def test_int8_linear_matches_float_and_every_route_agrees():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    int8 = Int8Linear.from_float(linear)
    x = torch.randn(3, 5, 64)
    reference = linear(x)
    fast = int8(x)  # dynamic int8 kernel
    assert fast.shape == reference.shape
    assert float((fast - reference).abs().max()) < 0.02 * float(reference.abs().max())
    # Inputs the int8 kernel cannot take (any GPU, other dtypes) run weight-only, and say so.
    with pytest.warns(UserWarning, match="weight-only"):
        weight_only = int8(x.double())
    expected = F.linear(x.double(), int8.dequantized_weight(torch.float64), linear.bias.double())
    torch.testing.assert_close(weight_only, expected)
    # Weights loaded in place must reach the packed copy the kernel reads.
    other = Int8Linear.from_float(torch.nn.Linear(64, 48))
    other.load_state_dict(int8.state_dict())
    assert torch.equal(other(x), fast)


def test_int8_logits_stay_close_to_float(trained_model):
    seq = successor_batch(4, 48, torch.Generator().manual_seed(1))
    int8_model, quantization = quantized(trained_model)
    assert len(quantization["layers"]) == 4 * trained_model.config.n_layer
    assert all(isinstance(int8_model.get_submodule(n), Int8Linear) for n in quantization["layers"])
    assert isinstance(int8_model.lm_head, torch.nn.Linear) and int8_model.lm_head.weight is int8_model.transformer.wte.weight
    with torch.no_grad():
        float_logits, float_loss = trained_model(seq[:, :-1], seq[:, 1:])
        int8_logits, int8_loss = int8_model(seq[:, :-1], seq[:, 1:])
    spread = float(float_logits.std())
    assert float((int8_logits - float_logits).abs().max()) < 0.1 * spread
    assert abs(float(int8_loss) / float(float_loss) - 1) < 0.05
    assert float((int8_logits.argmax(-1) == float_logits.argmax(-1)).float().mean()) > 0.95


def test_greedy_outputs_mostly_agree(trained_model):
    prompts = successor_batch(6, 4, torch.Generator().manual_seed(2))
    params = SamplingParams(max_new_tokens=16, temperature=0, stop_at_eot=False)
    float_output = generate(trained_model, prompts, params)
    for head in HEAD_FORMATS:
        int8_model, _ = quantized(trained_model, head)
        agreement = greedy_agreement(float_output, generate(int8_model, prompts, params), prompts.size(1))
        assert agreement["identical_tokens"] >= 0.9, (head, agreement)


def test_greedy_agreement_counts_positions_and_prefixes():
    reference = torch.tensor([[9, 1, 2, 3, 4], [9, 1, 2, 3, 4]])
    candidate = torch.tensor([[9, 1, 2, 3, 4], [9, 1, 7, 3, 4]])
    agreement = greedy_agreement(reference, candidate, prompt_tokens=1)
    assert agreement["identical_tokens"] == 7 / 8
    assert agreement["identical_prefix_fraction"] == (4 + 1) / 8
    assert agreement["identical_rows"] == 1 and agreement["rows"] == 2


@pytest.mark.parametrize("head", HEAD_FORMATS)
def test_artifact_round_trip_gives_identical_logits(trained_model, tmp_path, head):
    int8_model, quantization = quantized(trained_model, head)
    save_int8(tmp_path / "int8", int8_model, quantization)
    meta = json.loads((tmp_path / "int8" / CONFIG_FILE).read_text())
    assert meta["artifact"] == "int8" and meta["quantization"]["layers"] == quantization["layers"]
    assert meta["quantization"]["head"] == head
    reloaded, _ = load_model(tmp_path / "int8")
    if head == "fp16":
        assert isinstance(reloaded.lm_head, Fp16WeightLinear)
        assert reloaded.lm_head.weight is reloaded.transformer.wte.weight
    if head == "int8":
        assert isinstance(reloaded.transformer.wte, Int8Embedding)
        assert reloaded.lm_head.weight is reloaded.transformer.wte.weight
    seq = successor_batch(2, 20, torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(reloaded(seq)[0], int8_model(seq)[0])


def test_pruned_widths_quantize_and_reload(tmp_path):
    torch.manual_seed(0)
    model = GPT(small_config(vocab_size=VOCAB, mlp_hidden=[40, 24], n_head_per_layer=[4, 2])).eval()
    int8_model, quantization = quantized(model)
    save_int8(tmp_path / "int8", int8_model, quantization)
    reloaded, _ = load_model(tmp_path / "int8")
    assert reloaded.get_submodule("transformer.h.1.mlp.c_fc").weight.shape == (24, 32)
    seq = torch.randint(0, VOCAB, (1, 10))
    with torch.no_grad():
        assert torch.equal(reloaded(seq)[0], int8_model(seq)[0])


def test_missing_or_corrupt_int8_artifact_gets_a_clear_error(trained_model, tmp_path):
    with pytest.raises(ArtifactError, match=f"^no such folder: {re.escape(str(tmp_path / 'nowhere'))}; "):
        load_model(tmp_path / "nowhere")
    int8_model, quantization = quantized(trained_model)
    good = tmp_path / "good"
    save_int8(good, int8_model, quantization)

    truncated = tmp_path / "truncated"
    shutil.copytree(good, truncated)
    data = (truncated / WEIGHTS_FILE).read_bytes()
    (truncated / WEIGHTS_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match="damaged"):
        load_model(truncated)

    no_section = tmp_path / "no_section"
    shutil.copytree(good, no_section)
    meta = json.loads((no_section / CONFIG_FILE).read_text())
    del meta["quantization"]
    (no_section / CONFIG_FILE).write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="no 'quantization' section"):
        load_model(no_section)

    missing_scale = tmp_path / "missing_scale"
    state = int8_state_for_saving(int8_model)
    del state["transformer.h.1.mlp.c_fc.weight_scale"]
    write_folder_atomically(missing_scale, artifact_writers(state, int8_model.config, "int8", provenance("tests"),
                                                            extra={"quantization": quantization}))
    with pytest.raises(ArtifactError, match="missing transformer.h.1.mlp.c_fc.weight_scale"):
        load_model(missing_scale)

    float_weights = tmp_path / "float_weights"  # an int8 config over float tensors
    save_artifact(float_weights, trained_model, trained_model.config, "int8", provenance("tests"),
                  extra={"quantization": quantization})
    with pytest.raises(ArtifactError, match="expected torch.int8"):
        load_model(float_weights)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A float checkpoint with the GPT-2 vocabulary and a small local WikiText-layout corpus."""
    root = tmp_path_factory.mktemp("quantize")
    torch.manual_seed(0)
    model = GPT(small_config()).eval()
    save_artifact(root / "float", model, model.config, "float", provenance("tests"))
    corpus = root / "corpus"
    corpus.mkdir()
    text = " = Quantization = \n\n" + " ".join(f"The layer {i} maps int8 weights to scales." for i in range(300)) + "\n"
    (corpus / "wiki.valid.raw").write_text(text)
    return root


def run_cli(workspace, out, *extra):
    dynamic.main(["--checkpoint", str(workspace / "float"), "--out-dir", str(out), "--dataset",
                  str(workspace / "corpus"), "--eval-batches", "2", "--eval-batch-size", "2",
                  "--prompt-tokens", "8", "--new-tokens", "4", "--repeats", "1", *extra])


def test_cli_writes_artifact_and_report_that_sample_loads(workspace, monkeypatch, capsys):
    monkeypatch.setenv("GPT2_DATA_CACHE", str(workspace / "cache"))
    out = workspace / "int8"
    run_cli(workspace, out)
    report = json.loads((out / dynamic.REPORT_FILE).read_text())
    validation = report["validation"]
    assert validation["val_tokens"] == 2 * 2 * 64
    assert abs(validation["loss_increase_pct"]) < 1.0
    assert set(report["generation"]) >= {"batch_1", "batch_12"}
    assert report["generation"]["batch_12"]["int8_tokens_per_s"] > 0
    assert report["size_bytes"]["int8"] < report["size_bytes"]["float"]
    assert report["quantization"]["head"] == "int8"  # the default
    assert (report["dataset"], report["dataset_chosen"]) == (str(workspace / "corpus"), "from --dataset")
    printed, said = capsys.readouterr()
    assert printed.startswith(f"validation on {workspace / 'corpus'}, validation split, windows of 64 tokens\n")
    assert "val loss" in printed and "tokens/s batch 12" in printed
    # The whole run's estimate once its first units were timed; each speed ratio beside this run's noise floor.
    assert re.search(r"^estimate: generation warm-up .+, first validation batch .+: about .+ for the whole run, "
                     r".+ to go$", said, re.MULTILINE), said
    for b in (1, 12):
        row = report["generation"][f"batch_{b}"]
        assert row["noise_floor"] >= max(0.05, abs(row["float_against_itself"] - 1))
        shown = re.search(rf"^tokens/s batch {b} .*  (.+)$", printed, re.MULTILINE).group(1)
        within = abs(row["speedup"] - 1) <= row["noise_floor"]
        assert shown == (f"no measurable change (+-{row['noise_floor']:.0%} noise floor)" if within else
                         f"{row['speedup']:.2f}x (noise floor +-{row['noise_floor']:.0%})"), printed

    sample.main(["--checkpoint", str(out), "--prompt", "The layer", "--max-new-tokens", "5", "--seed", "1"])
    captured = capsys.readouterr()
    assert "loaded int8 model" in captured.err and captured.out.startswith("--- sample 1 ---\nThe layer")


def test_without_dataset_it_measures_on_the_checkpoints_training_data_and_block(workspace, monkeypatch, capsys):
    from storage.training_state import STATE_FILE, TrainingState
    monkeypatch.setenv("GPT2_DATA_CACHE", str(workspace / "cache"))
    train = workspace / "train"
    shutil.copytree(workspace / "float", train)
    (train / "training_state").mkdir()
    TrainingState(step=1, sampler={}, global_batch=2, train_config={"dataset": str(workspace / "corpus"),
                                                                    "block_size": 32}, torch_rng=[0]).write(train / STATE_FILE)
    dynamic.main(["--checkpoint", str(train), "--out-dir", str(workspace / "int8_own"), "--eval-batches", "1",
                  "--eval-batch-size", "1", "--prompt-tokens", "4", "--new-tokens", "2", "--repeats", "1"])
    report = json.loads((workspace / "int8_own" / dynamic.REPORT_FILE).read_text())
    assert (report["dataset"], report["eval_block_size"]) == (str(workspace / "corpus"), 32)
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (f"model: {train} (--checkpoint); dataset: {workspace / 'corpus'} (the checkpoint's training "
                     f"dataset, recorded in {train / STATE_FILE})")


def test_quantizing_an_int8_artifact_is_refused(workspace, monkeypatch, capsys):
    monkeypatch.setenv("GPT2_DATA_CACHE", str(workspace / "cache"))
    out = workspace / "int8_head"
    run_cli(workspace, out, "--head", "int8")
    assert json.loads((out / CONFIG_FILE).read_text())["quantization"]["head"] == "int8"
    with pytest.raises(SystemExit, match="is an int8 artifact; quantizing it again would only add error. Use the float or pruned checkpoint it "
                                         "was made from: --checkpoint .*float"):
        dynamic.main(["--checkpoint", str(out), "--out-dir", str(workspace / "again")])
    assert not (workspace / "again").exists()


def test_default_checkpoint_skips_int8_artifacts(tmp_path, small_model):
    from storage.run_folder import default_checkpoint
    save_artifact(tmp_path / "train", small_model, small_model.config, "float", provenance("train.py"))
    int8_model, quantization = quantized(small_model)
    save_int8(tmp_path / "int8", int8_model, quantization)  # newer, but not quantizable
    assert default_checkpoint(tmp_path)[0] == tmp_path / "train"


@pytest.mark.parametrize("argv, message", [
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--eval-block-size", "1000"], "exceeds the model's context"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
])
def test_bad_input_gets_a_clear_error(workspace, monkeypatch, argv, message):
    monkeypatch.setenv("GPT2_DATA_CACHE", str(workspace / "cache"))
    with pytest.raises(SystemExit, match=message):
        dynamic.main(["--checkpoint", str(workspace / "float"), "--out-dir", str(workspace / "bad"),
                      "--dataset", str(workspace / "corpus"), *argv])


def test_a_run_stopped_while_measuring_leaves_no_report_of_another_run(workspace, monkeypatch, capsys):
    monkeypatch.setenv("GPT2_DATA_CACHE", str(workspace / "cache"))
    out = workspace / "int8_stopped"
    run_cli(workspace, out, "--head", "fp32")
    assert json.loads((out / dynamic.REPORT_FILE).read_text())["quantization"]["head"] == "fp32"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dynamic, "paired_validation", killed)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(workspace, out, "--head", "int8")
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f"stopped by SIGINT {dynamic.not_measured_yet(out)}; exit status 130"
    report = json.loads((out / dynamic.REPORT_FILE).read_text())
    assert json.loads((out / CONFIG_FILE).read_text())["quantization"]["head"] == "int8"
    assert report["quantization"]["head"] == "int8" and report["measured"] is False
