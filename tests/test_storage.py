"""The storage layer's checks: every field read from config.json and state.json is checked and named, a tool
refuses an artifact kind it cannot use before reading its weights, and no tool writes over its own source."""
import json
import os
from pathlib import Path

import pytest

from model.int8 import quantize_model
from runtime.provenance import provenance
from storage.artifact import WEIGHTS_FILE, int8_artifact_writers, load_model, save_artifact, write_folder_atomically
from storage.claim import claim_output_folder
from storage.folder import release_writer_lock
from storage.meta import CONFIG_FILE
from storage.training_state import STATE_FILE, TrainingState
from storage.weights import ArtifactError


def edited_config(folder, **fields):
    path = folder / CONFIG_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return path


@pytest.mark.parametrize("fields, named", [
    ({"step": "12"}, "\"step\" is '12', not a count of steps"),
    ({"step": -1}, "\"step\" is -1, not a count of steps"),
    ({"produced_by": ["train.py"]}, "\"produced_by\" is a JSON list, not an object"),
    ({"produced_by": {"tool": 7}}, "\"produced_by.tool\" is 7, not text"),
    ({"quantization": "int8"}, "\"quantization\" is a JSON string, not an object"),
    ({"pruning": 0.5}, "\"pruning\" is a JSON number, not an object"),
    ({"artifact": "fp8"}, "names artifact kind 'fp8'"),
])
def test_a_bad_config_field_is_named_with_the_file_and_the_fix(small_artifact, fields, named):
    path = edited_config(Path(small_artifact), **fields)
    with pytest.raises(ArtifactError) as error:
        load_model(small_artifact)
    assert str(path) in str(error.value) and named in str(error.value)
    assert "damaged" in str(error.value) or "expected one of" in str(error.value)


def saved_state(folder, **fields) -> dict:
    state = TrainingState(step=3, sampler={"epoch": 0}, global_batch=2, train_config={"dataset": "builtin"},
                          torch_rng=[0, 1, 255])
    (folder / "training_state").mkdir(parents=True, exist_ok=True)
    state.write(folder / STATE_FILE)
    data = {**json.loads((folder / STATE_FILE).read_text()), **fields}
    (folder / STATE_FILE).write_text(json.dumps(data))
    return data


def test_a_training_state_reads_back_as_written(tmp_path):
    saved_state(tmp_path)
    state = TrainingState.read(tmp_path)
    assert (state.step, state.global_batch, state.torch_rng, state.cuda_rng) == (3, 2, [0, 1, 255], [])
    assert TrainingState.read(tmp_path / "not_a_run") is None


@pytest.mark.parametrize("fields, named", [
    ({"step": 2.5}, "\"step\" is '2.5', not a count of steps"),
    ({"global_batch": 0}, "\"global_batch\" is '0', not a count of sequences"),
    ({"torch_rng": [0, 256]}, "\"torch_rng\" is '[0, 256]', not a list of bytes"),
    ({"cuda_rng": [[1], "x"]}, "\"cuda_rng\" is \"[[1], 'x']\", not a list of lists of bytes"),
    ({"train_config": None}, "\"train_config\" is 'None', not an object"),
])
def test_a_bad_training_state_field_is_named_with_the_file_and_the_fix(tmp_path, fields, named):
    saved_state(tmp_path, **fields)
    with pytest.raises(ArtifactError) as error:
        TrainingState.read(tmp_path)
    assert str(tmp_path / STATE_FILE) in str(error.value) and named in str(error.value)
    assert "the checkpoint is damaged; resume from another checkpoint or start a new run" in str(error.value)


def test_a_training_state_without_a_field_names_it(tmp_path):
    data = saved_state(tmp_path)
    (tmp_path / STATE_FILE).write_text(json.dumps({k: v for k, v in data.items() if k != "sampler"}))
    with pytest.raises(ArtifactError, match="state.json has no \"sampler\"; the checkpoint is damaged"):
        TrainingState.read(tmp_path)


def test_a_kind_a_tool_cannot_use_is_refused_before_its_weights_are_read(small_model, tmp_path):
    folder = tmp_path / "int8"
    write_folder_atomically(folder, int8_artifact_writers(small_model, provenance("quantize/dynamic.py", "out/float"),
                                                          quantize_model(small_model)))
    (folder / WEIGHTS_FILE).write_bytes(b"damaged")  # never read: the kind is refused first
    with pytest.raises(ArtifactError) as error:
        load_model(folder, kinds=("float", "pruned"), why="pruning needs a floating-point model")
    assert str(error.value) == (f"{folder} is an int8 artifact; pruning needs a floating-point model. Use the float "
                                f"or pruned checkpoint it was made from: --checkpoint out/float")


def test_the_source_is_never_the_output_however_spelt(small_artifact, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(small_artifact)
    for output in (small_artifact, small_artifact + "/", link, f"{tmp_path}/./artifact"):
        with pytest.raises(ArtifactError, match="is the source .*: writing there would replace the model being "
                                                "read; choose another output folder"):
            claim_output_folder(output, "tests", overwrite=True, source=small_artifact)
    assert {CONFIG_FILE, WEIGHTS_FILE} <= set(os.listdir(small_artifact))
    load_model(small_artifact)  # nothing was removed


def test_overwrite_is_the_one_deleter_whoever_wrote_the_folder(small_model, tmp_path):
    folder = tmp_path / "out"
    save_artifact(folder, small_model, small_model.config, "float", provenance("tests"))
    claim_output_folder(folder, "tests", overwrite=False)  # its own artifact: kept until the next save
    release_writer_lock(folder)
    assert (folder / WEIGHTS_FILE).exists()
    claim_output_folder(folder, "tests", overwrite=True)
    release_writer_lock(folder)
    assert not (folder / WEIGHTS_FILE).exists() and not (folder / CONFIG_FILE).exists()


def test_storage_sits_between_the_model_and_the_tools():
    """storage/ builds on model/ and runtime/ only: the tools and train.py load artifacts through it, so
    nothing that loads a model needs training/ or parallel/."""
    import ast
    root = Path(__file__).resolve().parent.parent / "storage"
    packages = set()
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            packages |= {m.split(".")[0] for m in modules}
    assert not packages & {"parallel", "training", "train", "serve", "prune", "quantize", "bench", "sample", "data"}


def test_loading_an_artifact_runs_no_initialiser_and_leaves_torch_dynamo_unimported(small_model, tmp_path):
    """A fresh interpreter (what a server or sample.py starts as) loads a float and an int8 artifact: the weights
    are the file's, and torch._dynamo, which an initialiser run on the meta device imports, is never imported."""
    import subprocess
    import sys
    save_artifact(tmp_path / "float", small_model, small_model.config, "float", provenance("tests"))
    expected = float(small_model.transformer.wte.weight.double().sum())
    write_folder_atomically(tmp_path / "int8", int8_artifact_writers(small_model, provenance("tests"),
                                                                     quantize_model(small_model, head="int8")))
    script = ("import sys, torch\nfrom storage.artifact import load_model\n"
              f"model, _ = load_model({str(tmp_path / 'float')!r}, torch.device('cpu'))\n"
              f"load_model({str(tmp_path / 'int8')!r}, torch.device('cpu'))\n"
              "print(float(model.transformer.wte.weight.double().sum()), "
              "any(name.startswith('torch._dynamo') for name in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parent.parent)
    weights_sum, dynamo_imported = loaded.stdout.split()
    assert float(weights_sum) == expected and dynamo_imported == "False"
