"""The artifact-folder surfaces (tests/hostile.py's property): a hand-edited or damaged config.json,
model.safetensors or training_state/state.json, and an output folder that is the source under another name.

Every loading tool either works or answers one `error:` line naming the damaged file, and never changes the
folder it reads; a writing tool never deletes or alters its source, whatever the output folder is called."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import sample
import train
from prune import iterative
from quantize import dynamic
from storage import export
from storage.folder import GATE_LOCK, SWAP_LOCK, WRITER_LOCK
from tests.conftest import save_small_artifact
from tests.hostile import attempt, examples, file_digests, unchanged
from tests.test_damage import TOOLS
from tests.test_train import FAST
from train import TrainConfig

MODEL_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "vocab_pad_multiple", "dropout", "bias",
                "layer_norm_eps", "mlp_hidden", "n_head_per_layer")
TOP_FIELDS = ("artifact", "model", "step", "produced_by", "quantization", "pruning")
# Lock files a resume takes (and writes its process into) even when it then refuses the folder.
LOCK_FILES = (WRITER_LOCK, SWAP_LOCK, GATE_LOCK)

# JSON values of every type, sign and size: the numbers around the limits torch and numpy convert.
HUGE = st.sampled_from([10**12, 2**31, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63) - 1])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**17) | HUGE | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)


def nested(depth: int) -> str:
    """JSON text nested `depth` lists deep: past Python's recursion limit, json.loads raises RecursionError."""
    return "[" * depth + "]" * depth


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    return Path(save_small_artifact(tmp_path_factory.mktemp("good") / "artifact"))


@pytest.fixture(scope="module")
def victim(tmp_path_factory) -> Path:
    """An output folder already holding another artifact: --overwrite may delete it only for a loadable source."""
    return Path(save_small_artifact(tmp_path_factory.mktemp("victim") / "artifact"))


@pytest.fixture(scope="module")
def weights(artifact) -> dict[str, torch.Tensor]:
    return load_file(str(artifact / "model.safetensors"))


def fresh_copy(source: Path, name: str) -> Path:
    folder = source.parent.parent / name
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns(*LOCK_FILES))
    return folder


def run_tool(surface: str, run) -> tuple[str, str | None]:
    """`attempt` on a tool's `main`, with the `error:` line it exited with (None when it worked)."""
    said = {}

    def action():
        try:
            run()
        except SystemExit as e:
            said["message"] = e.code
            raise
    return attempt(surface, action), said.get("message")


def generate_one(folder: Path) -> tuple[str, str | None]:
    return run_tool("artifact folder", lambda: sample.main(["--checkpoint", str(folder), "--prompt", "x",
                                                            "--max-new-tokens", "1", "--device", "cpu"]))


def every_tool_refuses(folder: Path, damaged_file: str, victim: Path, out: Path) -> None:
    """What sample.py refused, every loading tool refuses, naming the file; and train.py --init-from it with
    --overwrite leaves the folder it would have written (holding another artifact) as it was."""
    for tool, run in TOOLS.items():
        outcome, message = run_tool(f"artifact folder: {tool}", lambda: run(str(folder), str(out)))
        assert outcome == "refused" and str(folder / damaged_file) in message, (tool, message)
    with unchanged("artifact folder: train --init-from", victim):
        outcome, message = run_tool("artifact folder: train --init-from", lambda: train.main(
            ["--init-from", str(folder), "--out-dir", str(victim), "--overwrite", "--device", "cpu"]))
    assert outcome == "refused" and str(folder / damaged_file) in message, message


def edited_config(artifact: Path, field: str, value, where: str) -> str:
    """config.json's text with one field of the model section or of the top level set, dropped or added."""
    meta = json.loads((artifact / "config.json").read_text())
    section = meta["model"] if where == "model" else meta
    if value is DROP:
        section.pop(field, None)
    else:
        section[field] = value
    return json.dumps(meta)


DROP = object()


@given(where=st.sampled_from(["model", "top"]), data=st.data(),
       value=JSON_VALUES | st.just(DROP), nesting=st.none() | st.integers(2_000, 100_000))
@example(where="model", data=None, value=10**12, nesting=None).via("N10: n_embd 1e12 overflowed a Storage size")
@example(where="model", data=None, value=DROP, nesting=100_000).via("N12: nesting deeper than json can read")
@examples(12)
def test_a_hand_edited_config_is_one_error_line_in_every_tool(artifact, victim, where, data, value, nesting):
    fields = MODEL_FIELDS if where == "model" else TOP_FIELDS
    field = data.draw(st.sampled_from([*fields, "extra"]), "field") if data else "n_embd"
    text = edited_config(artifact, field, value, where)
    if nesting:  # the whole file one deep nest instead of an edited field
        text = nested(nesting)
    folder = fresh_copy(artifact, "config_edited")
    (folder / "config.json").write_text(text)
    with unchanged("artifact config.json", folder):
        outcome, message = generate_one(folder)
    if outcome == "refused":
        assert str(folder / "config.json") in message or str(folder / "model.safetensors") in message, message
        every_tool_refuses(folder, "config.json" if "config.json" in message else "model.safetensors", victim,
                           artifact.parent / "out")


def damaged_weights(weights: dict[str, torch.Tensor], data) -> dict[str, torch.Tensor]:
    """The weights with one tensor given another dtype or shape, renamed, dropped, or one tensor added."""
    state = dict(weights)
    name = data.draw(st.sampled_from(sorted(state)), "tensor")
    damage = data.draw(st.sampled_from(["dtype", "shape", "rename", "drop", "add"]), "damage")
    if damage == "dtype":
        dtype = data.draw(st.sampled_from([torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool,
                                           torch.float16, torch.bfloat16, torch.float64]), "dtype")
        state[name] = state[name].to(dtype)
    elif damage == "shape":
        state[name] = data.draw(st.sampled_from([state[name][:1], state[name].reshape(-1)[:7], torch.zeros(()),
                                                 state[name].unsqueeze(0), torch.zeros(3, 2, 1)]), "shape")
    elif damage == "rename":
        state[data.draw(st.text(min_size=1, max_size=20), "new name")] = state.pop(name)
    elif damage == "drop":
        del state[name]
    else:
        state[data.draw(st.text(min_size=1, max_size=20).filter(lambda n: n not in state), "added")] = torch.ones(2)
    return state


@given(data=st.data(), cut=st.none() | st.integers(0, 10**9))
@example(data=None, cut=0).via("an empty weights file")
@example(data=None, cut=8).via("a weights file cut inside its header")
@examples(10)
def test_damaged_weights_are_one_error_line_naming_the_file(artifact, victim, weights, data, cut):
    folder = fresh_copy(artifact, "weights_damaged")
    path = folder / "model.safetensors"
    if cut is not None:  # truncated at any byte
        raw = path.read_bytes()
        path.write_bytes(raw[:cut % len(raw)])
    else:
        save_file({k: v.contiguous() for k, v in damaged_weights(weights, data).items()}, str(path))
    with unchanged("artifact model.safetensors", folder):
        outcome, message = generate_one(folder)
    if outcome == "refused":
        assert str(path) in message, message
        every_tool_refuses(folder, "model.safetensors", victim, artifact.parent / "out")


@pytest.fixture(scope="module")
def training_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "train"
    train.train(TrainConfig(**FAST, max_steps=2, eval_interval=100, out_dir=str(out)))
    return out


STATE_FIELDS = ("step", "global_batch", "sampler.epoch", "sampler.cursor", "sampler.seed", "sampler", "torch_rng",
                "cuda_rng", "parallel", "parallel.world_size", "parallel.tp_size", "train_config",
                "train_config.batch_size", "train_config.grad_accum", "train_config.seed", "train_config.max_steps",
                "extra")


def edited_state(state: dict, field: str, value) -> dict:
    section, _, key = field.rpartition(".")
    target = state[section] if section else state
    if value is DROP:
        target.pop(key, None)
    else:
        target[key] = value
    return state


def digests_without_locks(folder: Path) -> dict[str, str]:
    return {name: digest for name, digest in file_digests(folder).items() if name not in LOCK_FILES}


@given(field=st.sampled_from(STATE_FIELDS), value=JSON_VALUES | st.just(DROP),
       nesting=st.none() | st.integers(2_000, 100_000))
@example(field="sampler.cursor", value=-1, nesting=None).via("N11: a negative cursor was a ValueError traceback")
@example(field="global_batch", value=7, nesting=None).via("N11: a global batch the run's batch of 4 cannot make")
@examples(4)
def test_a_hand_edited_training_state_is_one_error_line_on_resume(training_run, field, value, nesting):
    folder = fresh_copy(training_run, "state_edited")
    path = folder / "training_state" / "state.json"
    state = edited_state(json.loads(path.read_text()), field, value)
    path.write_text(nested(nesting) if nesting else json.dumps(state))
    before = digests_without_locks(folder)
    outcome, message = run_tool("training_state/state.json", lambda: train.main(
        ["--resume", "--out-dir", str(folder), "--max-steps", "2", "--device", "cpu"]))
    if outcome == "refused":
        assert str(folder) in message and ("state.json" in message or "--max-steps" in message), message
        assert digests_without_locks(folder) == before, "a refused resume changed the run folder"
    if (field, value) in (("sampler.cursor", -1), ("global_batch", 7)):
        assert outcome == "refused" and f'"{field}" is {value}' in message, message


# Writing tools, each given the source and an output folder.
WRITERS = {
    "quantize": lambda src, out: dynamic.main(["--checkpoint", src, "--out-dir", out, "--overwrite"]),
    "export": lambda src, out: export.main(["--checkpoint", src, "--out", out, "--overwrite"]),
    "prune": lambda src, out: iterative.main(["--checkpoint", src, "--target", "0.5", "--out-dir", out,
                                              "--overwrite"]),
    "train --init-from": lambda src, out: train.main(
        ["--init-from", src, "--out-dir", out, "--overwrite", "--device", "cpu", "--max-steps", "1"]),
}


@pytest.fixture(scope="module")
def aliases(tmp_path_factory, artifact) -> dict[str, str]:
    """Names of the source folder, of folders inside it and of folders above it: every one is refused as an
    output.  A bind mount (another name the kernel gives the very folder) where this process may mount."""
    root = tmp_path_factory.mktemp("aliases")
    source = root / "source"
    shutil.copytree(artifact, source)
    (root / "link").symlink_to(source)
    (root / "other").mkdir()
    names = {"itself": str(source), "trailing slash": f"{source}/", "trailing /.": f"{source}/.",
             "through ..": f"{root}/other/../source", "symlink": str(root / "link"),
             "inside, not yet made": f"{source}/int8", "inside through the symlink": f"{root}/link/sub/out",
             "its parent": str(root), "its parent through ..": f"{source}/..", "the file system root": "/"}
    bind = root / "bind"
    bind.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "--bind", str(source), str(bind)],
                                                   capture_output=True).returncode == 0
    if mounted:
        names.update({"bind mount": str(bind), "inside the bind mount": f"{bind}/out"})
    yield names
    if mounted:
        subprocess.run(["umount", str(bind)], check=True)


@given(alias=st.sampled_from(["itself", "trailing slash", "trailing /.", "through ..", "symlink",
                              "inside, not yet made", "inside through the symlink", "its parent",
                              "its parent through ..", "the file system root", "bind mount",
                              "inside the bind mount"]),
       tool=st.sampled_from(sorted(WRITERS)))
@example(alias="bind mount", tool="quantize").via("issue 39: quantize --overwrite into a bind mount deleted it")
@example(alias="bind mount", tool="export")
@example(alias="bind mount", tool="train --init-from")
@examples(10)
def test_an_output_folder_that_is_the_source_under_any_name_is_refused(aliases, alias, tool):
    if alias not in aliases:
        pytest.skip("bind mounts need root and a kernel that allows them here")
    source = aliases["itself"]
    with unchanged(f"output folder: {tool}", source):
        outcome, message = run_tool(f"output folder: {tool}", lambda: WRITERS[tool](source, aliases[alias]))
    assert outcome == "refused" and "the output folder" in message and source in message, message


def test_a_hard_linked_copy_of_the_source_may_be_overwritten_without_touching_the_source(artifact, tmp_path):
    """`cp -al`: another folder whose files are the source's files.  Writing it replaces its names (saves are
    staged and renamed into place, lock files given their own inode); the source keeps every byte."""
    copy = tmp_path / "hard-linked copy"
    subprocess.run(["cp", "-al", str(artifact), str(copy)], check=True)
    assert os.stat(copy / "model.safetensors").st_ino == os.stat(artifact / "model.safetensors").st_ino
    with unchanged("output folder: hard links", artifact):
        outcome, message = run_tool("output folder: hard links", lambda: WRITERS["export"](str(artifact), str(copy)))
    assert outcome == "worked", message
    assert json.loads((copy / "config.json").read_text())["model_type"] == "gpt2"


# A run folder's metrics.jsonl, drawn by train.py's curves and by python -m bench.eval.plot_runs.
STEP_RECORD = {"step": 10, "tokens": 640, "loss": 9.5, "lr": 1e-3, "tokens_per_s": 1200.0}
EVAL_RECORD = {"step": 10, "tokens": 640, "val_loss": 9.7}


def hostile_metrics_line(value, field: str | None, nesting: int | None) -> str:
    """A JSON line of any value, a step or evaluation record with one field any value, or nesting past the parser."""
    if nesting:
        return nested(nesting)
    if field is None:
        return json.dumps(value)
    return json.dumps({**(EVAL_RECORD if field == "val_loss" else STEP_RECORD), field: value})


def test_bad_metrics_lines_are_said_once_a_process_and_again_when_more_appear(tmp_path, caplog):
    """train.py draws its curves at every evaluation: the same bad line is one warning, not one per evaluation."""
    from training.curves import read_metrics
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(STEP_RECORD) + "\n[1]\n" + json.dumps(EVAL_RECORD) + "\n")
    said = lambda: [r.getMessage() for r in caplog.records if r.name == "training.curves"]
    for _ in range(3):
        read_metrics(tmp_path)
    assert len(said()) == 1 and "left out 1 line" in said()[0], said()
    path.write_text(path.read_text() + "7\n" + json.dumps({**STEP_RECORD, "step": 20}) + "\n")
    read_metrics(tmp_path)
    read_metrics(tmp_path)
    assert len(said()) == 2 and "left out 2 lines" in said()[1], said()


@given(lines=st.lists(st.tuples(JSON_VALUES, st.none() | st.sampled_from([*STEP_RECORD, "val_loss"]),
                                st.none() | st.integers(2_000, 100_000)), min_size=1, max_size=4),
       cut_last=st.booleans())
@example(lines=[([1, 2], None, None)], cut_last=False).via("a JSON array line was a TypeError traceback")
@example(lines=[(3, None, None)], cut_last=False).via("a JSON number line was a TypeError traceback")
@example(lines=[("loss", None, None)], cut_last=True).via("a string holding 'loss' was indexed as a record")
@example(lines=[(10**400, "tokens", None)], cut_last=False).via("a count past a float's range")
@examples(8)
def test_any_metrics_line_is_left_out_with_one_warning_and_the_curves_drawn(tmp_path_factory, lines, cut_last,
                                                                               caplog):
    from bench.eval.plot_runs import main as plot_runs_main
    run = tmp_path_factory.mktemp("metrics_run")
    hostile = [hostile_metrics_line(*line) for line in lines]
    text = "\n".join([json.dumps(STEP_RECORD), *hostile, json.dumps({**STEP_RECORD, "step": 20, "tokens": 1280}),
                      json.dumps(EVAL_RECORD)]) + "\n" + ('{"step": 30, "lo' if cut_last else "")
    (run / "metrics.jsonl").write_text(text)
    caplog.clear()
    assert attempt("metrics.jsonl", lambda: plot_runs_main([str(run), "--out", str(run / "curves.png")])) == "worked"
    assert (run / "curves.png").stat().st_size > 0
    warnings = [r.getMessage() for r in caplog.records if r.name == "training.curves"]
    assert len(warnings) <= 1 and all("\n" not in w and str(run / "metrics.jsonl") in w for w in warnings), warnings
    assert (run / "metrics.jsonl").read_text() == text  # drawn from, never rewritten
    if lines[0] in (([1, 2], None, None), (3, None, None)):
        assert warnings and "line 2: " in warnings[0] and "not an object" in warnings[0], warnings
    from training.curves import read_metrics
    steps, evals = read_metrics(run)
    assert [r["step"] for r in steps][-1] == 20 and evals[-1]["val_loss"] == 9.7  # the good records all drawn
