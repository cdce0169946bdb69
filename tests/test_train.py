import json
from pathlib import Path

import pytest
import torch

import model.gpt
import train
from bench.eval.plot_runs import main as plot_runs_main
from runtime.provenance import provenance
from storage.artifact import STAGING_DIR, load_model, save_artifact
from storage.training_state import STATE_FILE, TrainingState
from model.config import PRESETS
from tests.conftest import interrupt_training_at_batch, save_small_artifact
from train import TrainConfig, TrainingError

# The final validation sweeps two batches, not the whole split, except where a test checks the sweep.
FAST = dict(model="tiny", dataset="builtin", device="cpu", batch_size=4, block_size=64, log_interval=1, eval_batches=2,
            final_eval_batches=2, warmup_steps=5, lr=2e-3, curves=False)


def losses(out_dir) -> dict[int, float]:
    """step -> training loss (the last record wins, as a resumed run re-logs its steps)."""
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_loss_falls_and_metrics_are_logged(tmp_path):
    out = tmp_path / "run"
    summary = train.train(TrainConfig(**{**FAST, "curves": True}, max_steps=40, eval_interval=20, out_dir=str(out),
                                      tensorboard=True))
    curve = losses(out)
    assert curve[1] > 10.0 and curve[40] < 7.5
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step_record = next(r for r in records if "loss" in r)
    assert {"step", "loss", "lr", "tokens_per_s", "mfu", "phase_s", "peak_memory_bytes"} <= set(step_record)
    assert set(step_record["phase_s"]) == {"data", "forward", "backward", "optimizer", "other"}
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [20, 40] and not evals[-1]["eval_full_split"]
    assert evals[-1]["val_tokens"] == 2 * 4 * 64  # --final-eval-batches 2
    assert summary.val_loss == evals[-1]["val_loss"] < 8.0
    assert evals[-1]["tokens"] == 40 * 4 * 64

    # The pictures: curves.png kept by the run, several runs overlaid by bench.eval.plot_runs.
    assert (out / "curves.png").read_bytes().startswith(b"\x89PNG")
    overlay = tmp_path / "overlay.png"
    plot_runs_main([str(out), str(out), "--labels", "a,b", "--out", str(overlay)])
    assert overlay.read_bytes().startswith(b"\x89PNG")

    # TensorBoard holds the same scalars.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    train_loss = {e.step: e.value for e in events.Scalars("train/loss")}
    assert train_loss[40] == pytest.approx(curve[40], rel=1e-6)
    assert [e.step for e in events.Scalars("validation/loss")] == [20, 40]
    tags = set(events.Tags()["scalars"])
    assert {"memory/peak_bytes", "memory/rank_0_peak_bytes", "phase/forward_s", "phase/backward_s",
            "phase/optimizer_s", "validation/seconds"} <= tags


def test_an_unbounded_final_validation_sweeps_the_whole_split(tmp_path, monkeypatch):
    """--final-eval-batches unset: every target of the validation split, on a small WikiText-layout folder (the
    built-in corpus's split takes about 13 s here)."""
    monkeypatch.setenv("GPT2_DATA_CACHE", str(tmp_path / "cache"))
    sentence = "The station opened in 1887 and was rebuilt after the war , with a new roof . "
    folder = tmp_path / "wikitext"
    folder.mkdir()
    (folder / "wiki.train.raw").write_text(" \n = Alpha = \n \n" + sentence * 200 + "\n")
    (folder / "wiki.valid.raw").write_text(" \n = Beta = \n \n" + sentence * 30 + "\n")
    summary = train.train(TrainConfig(**{**FAST, "dataset": str(folder), "final_eval_batches": None}, max_steps=2,
                                      eval_interval=1000, out_dir=str(tmp_path / "run")))
    from data.token_files import load_split
    assert summary.eval_full_split and summary.val_tokens == len(load_split(str(folder), "validation")) - 1
    assert summary.val_tokens > 2 * 4 * 64  # more than the bounded sweep of the other tests


def test_resume_after_interrupt_equals_uninterrupted_run(tmp_path, monkeypatch, capsys):
    full = tmp_path / "full"
    train.train(TrainConfig(**FAST, max_steps=10, eval_interval=5, out_dir=str(full)))

    broken = tmp_path / "broken"
    undo = interrupt_training_at_batch(monkeypatch, 8)
    with pytest.raises(SystemExit):
        train.train(TrainConfig(**FAST, max_steps=10, eval_interval=5, out_dir=str(broken)))
    undo()
    state = json.loads((broken / "training_state" / "state.json").read_text())
    assert state["step"] == 5
    captured = capsys.readouterr()
    assert "step 7/10:" in captured.out and "interrupted after step 7; the checkpoint of step 5" in captured.err

    train.train(TrainConfig(**FAST, max_steps=10, eval_interval=5, out_dir=str(broken), resume="yes"))
    expected, resumed = losses(full), losses(broken)
    for step in range(6, 11):
        assert resumed[step] == pytest.approx(expected[step], rel=1e-6, abs=0)
    # Steps 6 and 7 of the interrupted run are gone from the records: each step is logged once, in order.
    logged = [json.loads(line)["step"] for line in (broken / "metrics.jsonl").read_text().splitlines()
              if "loss" in json.loads(line)]
    assert logged == list(range(1, 11))
    assert not (full / "curves.png").exists()  # --no-curves: evaluations drew nothing


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_loss = model.gpt.head_cross_entropy  # the training loss; validation stays finite
    calls = {"n": 0}

    def nan_on_third(*args, **kwargs):
        calls["n"] += 1
        loss = real_loss(*args, **kwargs)
        return loss * float("nan") if calls["n"] == 3 else loss

    monkeypatch.setattr(model.gpt, "head_cross_entropy", nan_on_third)
    with pytest.raises(TrainingError, match=r"loss became nan \(gradient norm .*\) at step 3.*step 2.*intact"):
        train.train(TrainConfig(**FAST, max_steps=10, eval_interval=100, checkpoint_interval=2,
                                out_dir=str(out)))
    loaded, meta = load_model(out)
    assert meta.step == 2 and all(torch.isfinite(p).all() for p in loaded.parameters())


def test_weights_whose_loss_is_not_finite_are_not_saved_and_the_probe_is_one_short_row(tmp_path, monkeypatch):
    """The forward that proves a state savable sees one row of PROBE_TOKENS (a stop's save at GPT-2 Medium must fit
    the grace), and a non-finite loss there keeps the last good checkpoint."""
    import training.trainer
    out, probed = tmp_path / "run", []
    real_evaluate = training.trainer.evaluate_loss

    def probe_goes_infinite(module, batches, *args, **kwargs):
        batches = list(batches)
        result = real_evaluate(module, batches, *args, **kwargs)
        if len(batches) == 1 and batches[0][0].shape == (1, training.trainer.PROBE_TOKENS):
            probed.append(batches[0][0].shape)
            if len(probed) == 2:  # step 4's save: step 2's is the last good one
                result["val_loss"] = float("inf")
        return result

    monkeypatch.setattr(training.trainer, "evaluate_loss", probe_goes_infinite)
    with pytest.raises(TrainingError, match=r"validation loss became inf after the update of step 4.*step 2"):
        train.train(TrainConfig(**{**FAST, "block_size": 128}, max_steps=10, eval_interval=100,
                                checkpoint_interval=2, out_dir=str(out)))
    assert len(probed) == 2
    assert load_model(out)[1].step == 2


def test_crash_during_save_keeps_previous_checkpoint(tmp_path, small_model):
    folder = tmp_path / "ckpt"
    save_artifact(folder, small_model, small_model.config, "float", provenance("tests"))
    before = load_model(folder)[0].state_dict()

    from storage import artifact
    writers = artifact.artifact_writers(artifact.model_state_for_saving(small_model), small_model.config,
                                        "float", provenance("tests"))
    writers["zz_crash"] = lambda p: (_ for _ in ()).throw(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        artifact.write_folder_atomically(folder, writers)
    after = load_model(folder)[0].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not (folder / STAGING_DIR).exists()


def test_checkpoint_round_trip_gives_identical_logits(small_model, small_artifact):
    loaded, meta = load_model(small_artifact)
    idx = torch.randint(0, 50257, (2, 9))
    assert torch.equal(small_model(idx)[0], loaded(idx)[0])
    assert meta.kind == "float" and meta.produced_by.tool == "tests"
    assert loaded.lm_head.weight is loaded.transformer.wte.weight


@pytest.mark.parametrize("argv, message", [
    (["--block-size", "4096"], "--block-size 4096 is larger than the model's context of 256"),
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--dataset", "/no/such/folder"], "neither a known name"),
    (["--device", "banana"], "--device 'banana' is not a device"),
])
def test_bad_arguments_fail_fast_with_a_message(tmp_path, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv + ["--out-dir", str(tmp_path / "x"), "--max-steps", "1"])
    assert message in str(exit_info.value.code)


def test_unknown_preset_is_an_argument_error():
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--model", "gpt5"])
    assert "invalid choice: 'gpt5'" in exit_info.value.code


def test_a_run_cannot_write_over_the_checkpoint_it_starts_from(tmp_path, small_artifact):
    init = tmp_path / "init"
    (init).symlink_to(small_artifact)
    for out_dir in (small_artifact, small_artifact + "/", f"{tmp_path}/./artifact", str(init)):
        with pytest.raises(SystemExit) as exit_info:
            train.main(["--init-from", small_artifact, "--out-dir", out_dir, "--overwrite", "--max-steps", "1"])
        assert str(exit_info.value.code) == (f"error: the output folder {Path(out_dir)} is the source {small_artifact}: "
                                             f"writing there would replace the model being read; give --out-dir "
                                             f"another folder")
    assert load_model(small_artifact)[1].produced_by.tool == "tests"  # nothing was removed


def test_a_model_size_given_beside_init_from_must_be_the_checkpoints(tmp_path):
    tiny = save_small_artifact(tmp_path / "tiny-sized", **{k: v for k, v in PRESETS["tiny"].items()})
    other = save_small_artifact(tmp_path / "other")  # 2 layers of width 32
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--model", "tiny", "--init-from", other, "--out-dir", str(tmp_path / "run"), "--max-steps", "1"])
    assert str(exit_info.value.code) == (
        f"error: --model tiny is 4 layers of width 128 (4 heads), but --init-from {other} holds 2 layers of width 32 "
        f"(4 heads), which the run would train; drop --model (--init-from sets the size) or start from a checkpoint "
        f"of tiny's size")
    assert not (tmp_path / "run").exists()  # refused before anything was written
    train.main(["--model", "tiny", "--init-from", tiny, "--out-dir", str(tmp_path / "run"), "--max-steps", "1",
                "--dataset", "builtin", "--device", "cpu", "--batch-size", "2", "--block-size", "64",
                "--eval-batches", "1", "--final-eval-batches", "1", "--no-curves"])


@pytest.mark.parametrize("flag, value, message", [
    ("--seed", "-1", "--seed must be a whole number from 0 to 2**63 - 1, got -1"),
    ("--out-dir", "", "--out-dir must name a folder"),
])
def test_bad_seed_and_empty_out_dir_are_refused(flag, value, message):
    with pytest.raises(SystemExit) as exit_info:
        train.main([flag, value, "--max-steps", "1"])
    assert str(exit_info.value.code).startswith(f"error: {message}")


def test_an_out_dir_that_is_a_symlink_loop_is_one_error(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--out-dir", str(loop), "--max-steps", "1"])
    assert str(exit_info.value.code).startswith(f"error: {loop} cannot be used as a folder")


def test_existing_run_is_not_overwritten_without_resume(tmp_path):
    out = tmp_path / "run"
    train.train(TrainConfig(**FAST, max_steps=2, eval_interval=100, out_dir=str(out)))
    with pytest.raises(TrainingError, match="already holds a training run; pass --resume"):
        train.train(TrainConfig(**FAST, max_steps=2, eval_interval=100, out_dir=str(out)))


def test_cpu_allocation_failure_is_explained(tmp_path, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(model.gpt, "head_cross_entropy", out_of_memory)
    with pytest.raises(TrainingError, match="batch 4 x block 64 does not fit in cpu memory; lower --batch-size"):
        train.train(TrainConfig(**FAST, max_steps=2, eval_interval=100, out_dir=str(tmp_path / "run")))


def test_exploding_update_never_becomes_the_last_good_checkpoint(tmp_path):
    """--lr 1e9 makes the weights finite but useless after one update; that state must not be saved."""
    out = tmp_path / "run"
    with pytest.raises(TrainingError, match="; stopping. ") as failure:
        train.train(TrainConfig(**{**FAST, "lr": 1e9, "warmup_steps": 0}, max_steps=5, eval_interval=100,
                                checkpoint_interval=1, out_dir=str(out)))
    if (out / "config.json").exists():  # any checkpoint left behind gives a finite loss
        loaded, meta = load_model(out)
        assert f"step {meta.step}" in str(failure.value)
        _, loss = loaded(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))
        assert torch.isfinite(loss)
    else:
        assert "no checkpoint was written" in str(failure.value)


@pytest.mark.parametrize("flag, value", [("--grad-clip", "nan"), ("--lr", "inf"), ("--min-lr-ratio", "nan"),
                                         ("--warmup-steps", "-5"), ("--checkpoint-interval", "0"),
                                         ("--checkpoint-interval", "-1"), ("--dropout", "1.5")])
def test_impossible_numbers_are_refused_by_name(tmp_path, flag, value):
    with pytest.raises(SystemExit) as exit_info:
        train.main([flag, value, "--out-dir", str(tmp_path / "x")])
    assert str(exit_info.value.code).startswith(f"error: {flag} ")


def test_tools_without_checkpoint_pick_the_most_trained_run_of_the_demo(tmp_path, small_model, monkeypatch):
    """make demo's layout: out/demo/train (200 steps x 2,048 tokens), then an int8 copy and a 20-step FSDP
    run written after it.  With no --checkpoint the tools take the trained model and say why."""
    from storage.run_folder import default_checkpoint

    def training_run(folder, step, global_batch, block):
        save_artifact(folder, small_model, small_model.config, "float", provenance("train.py"), extra={"step": step})
        (folder / "training_state").mkdir()
        TrainingState(step=step, sampler={}, global_batch=global_batch, torch_rng=[],
                      train_config={"grad_accum": 1, "block_size": block}).write(folder / STATE_FILE)

    demo = tmp_path / "out" / "demo"
    training_run(demo / "train", 200, 8, 256)
    save_artifact(demo / "int8", small_model, small_model.config, "pruned", provenance("quantize/dynamic.py"))
    training_run(demo / "fsdp", 20, 8, 64)  # the newest folder
    folder, why = default_checkpoint(tmp_path / "out")
    assert folder == demo / "train" and "409,600" in why and "of 2 runs" in why
    monkeypatch.chdir(tmp_path)
    from tests.test_sample import run_sample
    result = run_sample("--prompt", "x", "--max-new-tokens", "2")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0].startswith(f"model: {Path('out/demo/train')} (the train.py checkpoint")


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "no-such-corpus"], "error: dataset 'no-such-corpus' is neither a known name"),
    (["--resume"], "error: --resume: "),
])
def test_a_refused_start_leaves_no_new_out_dir(tmp_path, argv, message):
    """Issue 42: a failed data check left .gate .swap .writer in a new output folder."""
    with pytest.raises(SystemExit) as exit_info:
        train.main([*argv, "--out-dir", str(tmp_path / "new" / "run"), "--max-steps", "1"])
    assert str(exit_info.value.code).startswith(message)
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_minutes_saves_on_the_clock_between_the_step_intervals(tmp_path, monkeypatch):
    """--checkpoint-minutes saves whenever that much wall-clock time has passed since the last save, whatever
    --checkpoint-interval says; the default half hour saves nothing extra in a run of seconds."""
    import training.checkpoint
    saved, real_save = [], training.checkpoint.Checkpointer.save

    def save(self, step):
        saved.append(step)
        real_save(self, step)
    monkeypatch.setattr(training.checkpoint.Checkpointer, "save", save)
    train.train(TrainConfig(**FAST, max_steps=3, eval_interval=100, checkpoint_minutes=1e-9, out_dir=str(tmp_path / "a")))
    assert saved == [1, 2, 3]
    saved.clear()
    train.train(TrainConfig(**FAST, max_steps=3, eval_interval=100, out_dir=str(tmp_path / "b")))
    assert saved == [3]


@pytest.mark.parametrize("model, lr, source", [("gpt2", 6e-4, "GPT-3 paper Table 2.1, 125M"),
                                               ("gpt2-medium", 3e-4, "GPT-3 paper Table 2.1, 350M"),
                                               ("tiny", 1e-3, "train.py's default for the CPU presets")])
def test_each_preset_trains_at_its_cited_learning_rate_unless_lr_is_given(model, lr, source):
    from training.preset_defaults import describe_lr
    assert TrainConfig(model=model).lr == lr and TrainConfig(model=model, lr=1e-4).lr == 1e-4
    assert describe_lr(lr, model, None) == f"lr {lr:.2e} ({model} default, {source})"
    assert describe_lr(1e-4, model, None) == "lr 1.00e-04 (given)"


def test_the_first_line_of_a_new_run_says_where_its_learning_rate_came_from(tmp_path, capsys):
    train.train(TrainConfig(**{**FAST, "lr": None}, max_steps=1, eval_interval=100, out_dir=str(tmp_path / "run")))
    assert capsys.readouterr().out.splitlines()[0] == "lr 1.00e-03 (tiny default, train.py's default for the CPU presets)"


def test_a_run_resolves_its_dataset_once(tmp_path, monkeypatch):
    """The --dataset name is resolved into a corpus once (for a hub repository, resolving downloads it) and that
    corpus is tokenized and loaded for both splits."""
    import data.corpus
    import data.token_files
    import training.trainer
    resolved, real_get_corpus = [], data.corpus.get_corpus

    def counted(name):
        resolved.append(name)
        return real_get_corpus(name)
    for module in (data.corpus, data.token_files, training.trainer):
        monkeypatch.setattr(module, "get_corpus", counted)
    train.train(TrainConfig(**FAST, max_steps=1, eval_interval=100, out_dir=str(tmp_path / "run")))
    assert resolved == ["builtin"]
