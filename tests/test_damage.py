"""Damage that still parses: every tool answers one `error:` line naming the damaged file, never a traceback.
Each row damages one thing in a copy of a good folder and runs every command-line tool on it."""
import json
import shutil

import pytest

import sample
import train
from bench import leaderboard
from bench.eval import perplexity
from prune import iterative
from quantize import dynamic
from serve import __main__ as serve_main
from storage import export
from tests.conftest import save_small_artifact
from tests.test_train import FAST
from train import TrainConfig


def edit_config(edit):
    def damage(folder):
        path = folder / "config.json"
        meta = json.loads(path.read_text())
        path.write_text(json.dumps(edit(meta)))
    return damage


def edit_model(**fields):
    return edit_config(lambda meta: {**meta, "model": {**meta["model"], **fields}})


def write(name, text):
    return lambda folder: (folder / name).write_text(text)


CONFIG_DAMAGE = {
    "shapes disagree with the weights": edit_model(n_embd=64),
    "a JSON list": write("config.json", "[1, 2]"),
    "a JSON string": write("config.json", '"gpt2"'),
    "no model section": edit_config(lambda meta: {k: v for k, v in meta.items() if k != "model"}),
    "n_head 0": edit_model(n_head=0),
    "vocab_pad_multiple 0": edit_model(vocab_pad_multiple=0),
    "n_layer a string": edit_model(n_layer="4"),
    "truncated": lambda folder: (folder / "config.json").write_text((folder / "config.json").read_text()[:40]),
}

TOOLS = {
    "sample.py": lambda f, out: sample.main(["--checkpoint", f, "--prompt", "x", "--max-new-tokens", "1"]),
    "serve": lambda f, out: serve_main.main(["--checkpoint", f]),
    "prune": lambda f, out: iterative.main(["--checkpoint", f, "--target", "0.5", "--out-dir", out]),
    "quantize": lambda f, out: dynamic.main(["--checkpoint", f, "--out-dir", out]),
    "leaderboard": lambda f, out: leaderboard.main(["--checkpoint", f, "--dataset", "builtin", "--out",
                                                    f"{out}/score.json"]),
    "perplexity": lambda f, out: perplexity.main(["--checkpoint", f]),
    "export": lambda f, out: export.main(["--checkpoint", f, "--out", out]),
}


def one_error_line(run, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        run()
    message = exit_info.value.code
    assert isinstance(message, str) and message.startswith("error: ") and "\n" not in message, message
    assert "Traceback" not in capsys.readouterr().err
    return message


@pytest.fixture(scope="module")
def good_artifact(tmp_path_factory):
    return save_small_artifact(tmp_path_factory.mktemp("good") / "artifact")


@pytest.mark.parametrize("damage", CONFIG_DAMAGE)
def test_every_tool_names_the_damaged_config(damage, good_artifact, tmp_path, capsys):
    folder = tmp_path / "damaged"
    shutil.copytree(good_artifact, folder)
    CONFIG_DAMAGE[damage](folder)
    for tool, run in TOOLS.items():
        message = one_error_line(lambda: run(str(folder), str(tmp_path / "out")), capsys)
        assert f"{folder}/config.json" in message, (tool, message)


@pytest.fixture(scope="module")
def training_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "train"
    train.train(TrainConfig(**FAST, max_steps=2, eval_interval=100, out_dir=str(out)))
    return out


RESUME_DAMAGE = {
    "optimizer.pt missing": (lambda f: (f / "training_state/optimizer.pt").unlink(), "optimizer.pt"),
    "optimizer.pt truncated": (lambda f: (f / "training_state/optimizer.pt").write_bytes(
        (f / "training_state/optimizer.pt").read_bytes()[:1000]), "optimizer.pt"),
    "optimizer.pt garbage": (write("training_state/optimizer.pt", "not a tensor file"), "optimizer.pt"),
    "state.json without sampler": (lambda f: (f / "training_state/state.json").write_text(json.dumps(
        {k: v for k, v in json.loads((f / "training_state/state.json").read_text()).items() if k != "sampler"})),
        "state.json"),
    "state.json with an unknown setting": (lambda f: (f / "training_state/state.json").write_text(json.dumps(
        {**json.loads((f / "training_state/state.json").read_text()),
         "train_config": {"lerning_rate": 1}})), "state.json"),
    "state.json truncated": (lambda f: (f / "training_state/state.json").write_text(
        (f / "training_state/state.json").read_text()[:100]), "state.json"),
    "config.json n_layer a string": (edit_model(n_layer="4"), "config.json"),
}


@pytest.mark.parametrize("damage", RESUME_DAMAGE)
def test_resume_names_the_damaged_file(damage, training_run, tmp_path, capsys):
    folder = tmp_path / "damaged"
    shutil.copytree(training_run, folder)
    spoil, file_name = RESUME_DAMAGE[damage]
    spoil(folder)
    message = one_error_line(lambda: train.main(["--resume", "--out-dir", str(folder), "--max-steps", "3"]), capsys)
    assert file_name in message and str(folder) in message, message
