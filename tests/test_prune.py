"""prune/: masks that hold, exact sparsity, structural shrink equivalences, the CLI end to end, clear errors."""
from __future__ import annotations

import json
import re
import random

import numpy as np
import pytest
import torch

from data.loader import WindowSampler
from model.config import GPTConfig
from decode.generate import generate
from model.gpt import GPT
from decode.sampling import SamplingParams
from prune import iterative
from prune.csr import csr_copy
from prune.finetune import FinetuneSettings, finetune
from prune.magnitude import magnitude_masks
from prune.masks import block_linear_weights, count_nonzero, prunable_parameters
from prune.methods import METHODS, ScoringInputs
from prune.schedule import sparsity_schedule
from prune.structured import StructureError, head_columns, select_units, shrink
from prune.wanda import input_feature_norms, wanda_masks
from runtime.device import precision_policy
from runtime.provenance import provenance
from storage.artifact import load_model, save_artifact
from storage.run_folder import default_checkpoint
from storage.training_state import STATE_FILE, TrainingState

CPU = torch.device("cpu")


def tiny_config(**overrides) -> GPTConfig:
    # A small vocabulary keeps these models fast; the CLI tests below use the real one.
    return GPTConfig(**{**dict(n_layer=2, n_head=4, n_embd=32, block_size=64, vocab_size=512), **overrides})


def random_model(seed=0, **overrides) -> GPT:
    torch.manual_seed(seed)
    model = GPT(tiny_config(**overrides))
    # Trained-looking biases and LayerNorms, so equivalence tests exercise them too.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def random_tokens(n=4000, vocab=512, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.uint16)


# --- schedule and masks ------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["cubic", "geometric"])
def test_schedule_rises_to_exactly_the_target(kind):
    steps = sparsity_schedule(0.8, 4, kind)
    assert len(steps) == 4 and steps[-1] == 0.8
    assert all(a < b for a, b in zip(steps, steps[1:]))
    assert steps[0] > 0.8 / 4 if kind == "cubic" else steps[0] == pytest.approx(1 - 0.2 ** 0.25)


def test_magnitude_reaches_exact_sparsity_and_prunes_smallest_first():
    model = random_model()
    params = prunable_parameters(model)
    magnitudes = torch.cat([p.detach().abs().flatten() for p in params.values()])
    masks = magnitude_masks(params, 0.8)
    masks.apply()
    nonzero, total = count_nonzero(params.values())
    assert total - nonzero == round(0.8 * total)
    kept = torch.cat([p.detach().abs().flatten() for p in params.values()])
    assert magnitudes[kept == 0].max() <= magnitudes[kept != 0].min()
    # Nothing outside the selected tensors was touched.
    assert count_nonzero([model.transformer.wte.weight])[0] == model.transformer.wte.weight.numel()


def test_iterative_masks_only_grow():
    model = random_model()
    params = prunable_parameters(model)
    masks = None
    for s in sparsity_schedule(0.9, 3):
        new = magnitude_masks(params, s, masks)
        if masks is not None:
            for name in params:
                assert not (new.masks[name] & ~masks.masks[name]).any()
        new.apply()
        masks = new


def test_masks_survive_optimizer_steps_and_weight_decay():
    model = random_model()
    params = prunable_parameters(model, ("linear", "bias"))
    masks = magnitude_masks(params, 0.6)
    masks.apply()
    sampler = WindowSampler(random_tokens(), 32, 4, seed=0)
    settings = FinetuneSettings(steps=5, lr=1e-2, weight_decay=0.5, warmup_steps=1)
    before = {n: p.detach().clone() for n, p in params.items()}
    finetune(model, sampler, settings, CPU, precision_policy(CPU, "fp32"), masks)
    for name, p in params.items():
        assert torch.count_nonzero(p[~masks.masks[name]]) == 0, name
    assert any(not torch.equal(p, before[n]) for n, p in params.items()), "fine-tuning changed nothing"


def test_wanda_prunes_each_tensor_exactly_and_uses_activations():
    model = random_model()
    params = prunable_parameters(model)
    batches = [(torch.randint(0, 512, (2, 16)), None) for _ in range(2)]
    norms = input_feature_norms(model, params, batches, CPU)
    assert all(n.shape == (p.shape[1],) and (n > 0).all() for n, p in zip(norms.values(), params.values()))
    masks = wanda_masks(params, norms, 0.7)
    for name, p in params.items():
        assert int((~masks.masks[name]).sum()) == round(0.7 * p.numel())
        pruned_per_row = (~masks.masks[name]).sum(1)
        assert pruned_per_row.max() - pruned_per_row.min() <= 1
    # A feature with a huge activation norm protects its column.
    name = "transformer.h.0.mlp.c_fc.weight"
    boosted = {**norms, name: norms[name].clone()}
    boosted[name][3] = 1e6
    assert wanda_masks(params, boosted, 0.7).masks[name][:, 3].all()


@pytest.mark.parametrize("name", ["magnitude", "row", "wanda"])
def test_every_method_cuts_to_the_sparsity_through_the_same_interface(name):
    model = random_model()
    method = METHODS[name]("linear")
    calibration = [(torch.randint(0, 512, (2, 16)), None)] if method.needs_calibration else None
    total = sum(t.numel() for t in method.pruned_tensors(model))
    cut = method.score(model, 0.5, None, ScoringInputs(model.config, calibration, CPU))
    pruned, masks = method.apply(model, cut)
    nonzero, _ = count_nonzero(method.pruned_tensors(pruned))
    assert 1 - nonzero / total == pytest.approx(0.5)
    assert (masks is None) == (name == "row")  # only masked methods have weights fine-tuning must keep at zero


# --- structural shrink -------------------------------------------------------------------------

def test_shrink_with_nothing_removed_matches_dense():
    model = random_model()
    idx = torch.randint(0, 512, (2, 20))
    keep_hidden = [torch.arange(model.config.layer_mlp_hidden(i)) for i in range(2)]
    keep_heads = [torch.arange(4) for _ in range(2)]
    same = shrink(model, keep_hidden, keep_heads)
    assert same.config.mlp_hidden == [128, 128] and same.config.n_head_per_layer == [4, 4]
    torch.testing.assert_close(same(idx)[0], model(idx)[0], rtol=0, atol=1e-6)


def test_removing_units_equals_zeroing_them_in_the_dense_model():
    model = random_model()
    idx = torch.randint(0, 512, (2, 20))
    hd = model.config.head_dim
    drop_head, drop_units = 2, torch.tensor([0, 5, 77])
    keep_hidden = [torch.arange(128), torch.tensor([j for j in range(128) if j not in drop_units.tolist()])]
    keep_heads = [torch.tensor([h for h in range(4) if h != drop_head]), torch.arange(4)]
    smaller = shrink(model, keep_hidden, keep_heads)
    assert smaller.config.n_head_per_layer == [3, 4] and smaller.config.mlp_hidden == [128, 125]
    assert smaller.num_parameters() < model.num_parameters()
    with torch.no_grad():
        model.transformer.h[0].attn.c_proj.weight[:, head_columns(torch.tensor([drop_head]), hd)] = 0
        model.transformer.h[1].mlp.c_proj.weight[:, drop_units] = 0
    torch.testing.assert_close(smaller(idx)[0], model(idx)[0], rtol=1e-5, atol=1e-5)


def test_select_units_keeps_the_strongest_and_refuses_to_empty_a_layer():
    model = random_model()
    with torch.no_grad():
        model.transformer.h[1].attn.c_proj.weight[:, head_columns(torch.tensor([1, 3]), 8)] *= 0.01
    keep_hidden, keep_heads = select_units(model, 0.5, model.config)
    assert keep_heads[1].tolist() == [0, 2]
    assert [len(k) for k in keep_hidden] == [64, 64]
    with pytest.raises(StructureError, match="every head of layer 0"):
        select_units(model, 0.9, model.config)


def test_csr_copy_computes_the_same_logits():
    model = random_model()
    params = prunable_parameters(model)
    magnitude_masks(params, 0.8).apply()
    idx = torch.randint(0, 512, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(csr_copy(model)(idx)[0], model(idx)[0], rtol=1e-4, atol=1e-4)


# --- the command line end to end ---------------------------------------------------------------

WORDS = ("the model learns a small language of words and numbers while pruning removes weights that "
         "matter least so the network keeps its loss low and runs faster on the same machine").split()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A local WikiText-layout dataset, its token cache, and a small float checkpoint 'written by train.py'."""
    root = tmp_path_factory.mktemp("prune")
    data = root / "corpus"
    data.mkdir()
    rng = random.Random(0)
    for split, n in (("train", 60), ("valid", 8), ("test", 4)):
        articles = [f" = Article {i} = \n" + " ".join(rng.choice(WORDS) for _ in range(120)) + " .\n" for i in range(n)]
        (data / f"wiki.{split}.raw").write_text("".join(articles))
    mp = pytest.MonkeyPatch()
    mp.setenv("GPT2_DATA_CACHE", str(root / "cache"))
    torch.manual_seed(0)
    checkpoint = root / "out" / "train"
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=64))
    save_artifact(checkpoint, model, model.config, "float", provenance("train.py"), extra={"step": 1})
    (checkpoint / "training_state").mkdir()
    TrainingState(step=1, sampler={}, global_batch=1, torch_rng=[], train_config={"dataset": str(data)}).write(
        checkpoint / STATE_FILE)
    yield root, checkpoint
    mp.undo()


FAST = ["--rounds", "2", "--finetune-steps", "2", "--batch-size", "2", "--block-size", "32", "--eval-batches", "2",
        "--speed-batch", "1", "--speed-seq-len", "16", "--speed-repeats", "1", "--generation-tokens", "4",
        "--warmup-steps", "1"]


def run_cli(*argv):
    iterative.main([*FAST, *argv])  # later flags win, so a test can override FAST


def test_a_run_estimates_itself_and_prints_each_speed_ratio_beside_its_own_rounds_noise_floor(workspace, capsys):
    root, checkpoint = workspace
    out = root / "estimated"
    run_cli("--target", "0.5", "--rounds", "2", "--checkpoint", str(checkpoint), "--out-dir", str(out))
    said = capsys.readouterr().err
    rounds = json.loads((out / "prune_report.json").read_text())["methods"]["magnitude"]["rounds"]
    for row in rounds:  # every round measured its floor: a copy of the dense model timed beside it
        itself = row["dense_against_itself"]
        assert row["noise_floor"] == max(0.05, abs(itself["forward"] - 1), abs(itself["generation"] - 1))
    baseline = rounds[0]
    assert baseline["forward_speedup"] == baseline["dense_against_itself"]["forward"]
    assert f"noise floor now +-{baseline['noise_floor']:.0%}" in said
    assert re.search(r"^estimate: about .+ per round \(first fine-tune step .+\), about .+ for the whole run, .+ to "
                     r"go$", said, re.MULTILINE), said
    for previous, row in zip(rounds, rounds[1:]):
        moved = row["dense_moved_since_last_round"]["generation"]
        assert moved == pytest.approx(row["dense_generation_tokens_per_s"] / previous["dense_generation_tokens_per_s"] - 1)
        assert row["measurable"]["generation"] == (abs(moved) <= row["noise_floor"])
        line = next(line for line in said.splitlines() if line.startswith(f"round {row['round']}/2: sparsity"))
        ratio, floor = row["generation_speedup"], row["noise_floor"]
        assert (f"generation not measurable on this host now (the dense model's own generation rate moved {moved:+.0%}"
                if not row["measurable"]["generation"] else
                f"generation no measurable change (+-{floor:.0%} noise floor)" if abs(ratio - 1) <= floor else
                f"generation {ratio:.2f}x (noise floor +-{floor:.0%})") in line
        assert "the zeros are stored dense: the model does the same work" in line  # magnitude: same work


def load_that_changes(dense_generation_rates: list[float], pruned_over_dense: float):
    """A stand-in for prune/speed.py's `measure`: the dense model (and its copy) generate at the next of
    `dense_generation_rates` each round, as a host whose load changes between rounds makes it, and the pruned model
    `pruned_over_dense` times as fast within the round."""
    rates = iter(dense_generation_rates)

    def measure(models, settings, device, vocab_size):
        dense = next(rates)
        return {name: {"forward_tokens_per_s": 1000.0,
                       "generation_tokens_per_s": dense * (pruned_over_dense if name in ("pruned", "csr") else 1)}
                for name in models}
    return measure


def test_a_ratio_whose_dense_side_moved_beyond_its_floor_is_not_measurable_and_never_the_headline(
        workspace, capsys, monkeypatch):
    """The issue's run: the dense model's generation fell from 4.03 to 0.46 tokens/s between rounds, and the summary
    printed `generation 5.33x (noise floor +-5%)`."""
    import prune.speed
    monkeypatch.setattr(prune.speed, "measure", load_that_changes([4.03, 0.46], pruned_over_dense=5.33))
    root, checkpoint = workspace
    out = root / "moved"
    run_cli("--target", "0.3", "--rounds", "1", "--checkpoint", str(checkpoint), "--out-dir", str(out),
            "--no-sparse-format-check")
    printed = capsys.readouterr()
    row = json.loads((out / "prune_report.json").read_text())["methods"]["magnitude"]["rounds"][1]
    assert row["noise_floor"] == 0.05 and row["dense_moved_since_last_round"]["generation"] == pytest.approx(0.46 / 4.03 - 1)
    assert row["measurable"] == {"forward": True, "generation": False}
    headline = next(line for line in printed.out.splitlines() if line.startswith("dense val_loss"))
    assert ("generation not measurable on this host now (the dense model's own generation rate moved -89% since the "
            "last round, beyond this round's +-5% noise floor)") in headline
    assert "forward no measurable change (+-5% noise floor)" in headline
    assert "5.33x" not in printed.out + printed.err


def test_a_ratio_whose_dense_side_held_within_its_floor_is_read_beside_that_floor(workspace, capsys, monkeypatch):
    import prune.speed
    monkeypatch.setattr(prune.speed, "measure", load_that_changes([4.03, 4.0], pruned_over_dense=1.5))
    root, checkpoint = workspace
    out = root / "held"
    run_cli("--target", "0.3", "--rounds", "1", "--checkpoint", str(checkpoint), "--out-dir", str(out),
            "--no-sparse-format-check")
    headline = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("dense val_loss"))
    assert "generation 1.50x (noise floor +-5%)" in headline


def test_two_methods_in_one_run_share_the_source_and_the_report(workspace):
    root, checkpoint = workspace
    out = root / "both"
    run_cli("--target", "0.5", "--method", "magnitude,row", "--rounds", "1", "--checkpoint", str(checkpoint),
            "--out-dir", str(out))
    report = json.loads((out / "prune_report.json").read_text())
    assert set(report["methods"]) == {"magnitude", "row"}
    assert {m["source_checkpoint"] for m in report["methods"].values()} == {str(checkpoint)}
    assert all(m["finished"] and m["rounds"][-1]["sparsity_pruned_tensors"] == pytest.approx(0.5)
               for m in report["methods"].values())


def test_row_pruning_end_to_end_and_methods_accumulate(workspace, capsys):
    root, checkpoint = workspace
    out = root / "pruned"
    run_cli("--target", "0.5", "--method", "row", "--checkpoint", str(checkpoint), "--out-dir", str(out))
    printed = capsys.readouterr().out
    assert f"loaded float checkpoint {checkpoint}" in printed and "training dataset" in printed
    model, meta = load_model(out)
    assert meta.kind == "pruned" and meta.pruning["method"] == "row"
    assert model.config.n_head_per_layer == [2, 2] and model.config.mlp_hidden == [64, 64]
    text = generate(model, torch.tensor([[1, 2, 3]]), SamplingParams(max_new_tokens=5, temperature=0, stop_at_eot=False))
    assert text.shape == (1, 8)
    report = json.loads((out / "prune_report.json").read_text())
    rows = report["methods"]["row"]["rounds"]
    assert [r["round"] for r in rows] == [0, 1, 2] and report["methods"]["row"]["finished"]
    assert rows[-1]["sparsity_pruned_tensors"] == pytest.approx(0.5)
    assert rows[-1]["parameters"] < rows[0]["parameters"]
    for key in ("val_loss", "forward_tokens_per_s", "generation_tokens_per_s", "forward_speedup", "time_s"):
        assert key in rows[-1]
    assert (out / "loss_vs_sparsity.png").stat().st_size > 0 and (out / "speed_vs_sparsity.png").stat().st_size > 0

    run_cli("--target", "0.8", "--method", "magnitude", "--checkpoint", str(checkpoint), "--out-dir", str(out),
            "--dense-control")
    report = json.loads((out / "prune_report.json").read_text())
    assert report["methods"]["magnitude"]["dense_control"]["finetune_steps"] == 4
    assert set(report["methods"]) == {"row", "magnitude"} and report["checkpoint"]["method"] == "magnitude"
    magnitude = report["methods"]["magnitude"]
    final = magnitude["rounds"][-1]
    assert final["pruned_tensors_original"] - final["pruned_tensors_nonzero"] == round(0.8 * final["pruned_tensors_original"])
    assert "real_speedup" in magnitude["sparse_format"] and "csr" in final
    model, meta = load_model(out)
    weights = block_linear_weights(model).values()
    nonzero, total = count_nonzero(weights)
    assert meta.pruning["method"] == "magnitude" and total - nonzero == round(0.8 * total)


def test_wanda_without_finetuning_and_default_checkpoint(workspace, monkeypatch, capsys):
    root, checkpoint = workspace
    monkeypatch.chdir(root)  # the default search looks under ./out
    run_cli("--target", "0.5", "--method", "wanda", "--finetune-steps", "0", "--out-dir", "out/wanda")
    printed = capsys.readouterr().out
    assert "train.py checkpoint under out/ trained on the most tokens" in printed
    assert str(checkpoint.relative_to(root)) in printed
    report = json.loads((root / "out/wanda/prune_report.json").read_text())
    rows = report["methods"]["wanda"]["rounds"]
    assert rows[-1]["val_loss"] == rows[-1]["val_loss_after_pruning"]
    assert rows[-1]["sparsity_pruned_tensors"] == pytest.approx(0.5)


def test_ctrl_c_keeps_the_last_finished_round(workspace, monkeypatch):
    root, checkpoint = workspace
    calls = []

    def interrupted_finetune(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(iterative, "finetune", interrupted_finetune)
    out = root / "interrupted"
    with pytest.raises(SystemExit) as exit_info:
        run_cli("--target", "0.5", "--method", "row", "--checkpoint", str(checkpoint), "--out-dir", str(out))
    assert exit_info.value.code == 130
    model, meta = load_model(out)
    assert meta.pruning["round"] == 1
    assert [r["round"] for r in json.loads((out / "prune_report.json").read_text())["methods"]["row"]["rounds"]] == [0, 1]


@pytest.mark.parametrize("argv, message", [
    (["--target", "1.2"], "--target must be below 1, got 1.2"),
    ([], "--target is required"),
    (["--target", "0.5", "--checkpoint", "/nonexistent/checkpoint"], "no such folder: /nonexistent/checkpoint; "),
    (["--target", "0.9", "--method", "row"], "would remove every head of layer 0"),
    (["--target", "0.5", "--method", "wanda", "--prune-params", "linear,embedding"], "linear weights only"),
    (["--target", "0.5", "--method", "magnitude,banana"], "choose from magnitude, row, wanda"),
])
def test_bad_input_gets_a_clear_error(workspace, argv, message, capsys):
    root, checkpoint = workspace
    if "--checkpoint" not in argv:
        argv = [*argv, "--checkpoint", str(checkpoint)]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(*argv, "--out-dir", str(root / "never"))
    assert message in str(exit_info.value.code)


def test_default_checkpoint_search_skips_non_training_artifacts(tmp_path):
    model = random_model()
    save_artifact(tmp_path / "train", model, model.config, "float", provenance("train.py"))
    save_artifact(tmp_path / "prune", model, model.config, "pruned", provenance("prune/iterative.py"))
    assert default_checkpoint(tmp_path)[0] == tmp_path / "train"
    with pytest.raises(ValueError, match="no checkpoint written by train.py"):
        default_checkpoint(tmp_path / "prune")
