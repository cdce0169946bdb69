"""configs/: every shipped run file loads against its tool's parser (a key that is not a flag, a value of the wrong
type or out of bounds fails here before a user meets it), the GPT-2 Medium files read the folder their training
writes, and `make demo` runs the demo's files.  tests/test_config_chain.py runs the GPT-2 Medium chain."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.eval.scorecard import LeaderboardConfig
from prune.config import PruneConfig
from quantize.dynamic import QuantizeConfig
from runtime.cli import given_fields, parse_config
from serve.config import ServeConfig
from train import main as train_main
from training.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "configs").rglob("*.toml"))
# A file's tool is the first word of its name: configs/RUN/train-tp.toml is train.py's.
TOOLS = {"train": TrainConfig, "prune": PruneConfig, "quantize": QuantizeConfig, "scorecard": LeaderboardConfig,
         "serve": ServeConfig}


def tool_of(path: Path):
    return TOOLS[path.stem.split("-")[0]]


def test_the_runs_the_docs_promise_are_shipped():
    names = {str(path.relative_to(ROOT / "configs")) for path in CONFIGS}
    assert {"demo/train.toml", "gpt2-wikitext103/train.toml", "gpt2-medium-wikitext103/train-fsdp.toml",
            "gpt2-medium-wikitext103/train-tp.toml", "gpt2-medium-wikitext103/prune.toml",
            "gpt2-medium-wikitext103/quantize.toml", "gpt2-medium-wikitext103/serve.toml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_shipped_config_loads_against_its_tool(path):
    assert path.stem.split("-")[0] in TOOLS, f"{path.name}: name it after its tool ({', '.join(TOOLS)})"
    parse_config(tool_of(path), "A tool.", ["--config", str(path)])


def test_the_gpt2_medium_runs_agree_on_the_global_batch():
    """FSDP's per-rank micro-batch over 4 ranks is TP's one replica's: the two layouts train the same run."""
    folder = ROOT / "configs/gpt2-medium-wikitext103"
    fsdp, tp = (parse_config(TrainConfig, "train", ["--config", str(folder / name)])
                for name in ("train-fsdp.toml", "train-tp.toml"))
    assert (fsdp.parallel, tp.parallel) == ("fsdp", "tp")
    assert fsdp.batch_size * 4 * fsdp.grad_accum == tp.batch_size * tp.grad_accum
    different = {name for name in vars(fsdp) if getattr(fsdp, name) != getattr(tp, name)}
    assert different == {"parallel", "batch_size"}  # out_dir too is one: the folder the downstream files read


def test_every_gpt2_medium_file_reads_the_folder_training_writes():
    folder = ROOT / "configs/gpt2-medium-wikitext103"
    trained = {parse_config(TrainConfig, "train", ["--config", str(folder / name)]).out_dir
               for name in ("train-fsdp.toml", "train-tp.toml")}
    read = {str(parse_config(tool_of(folder / name), "tool", ["--config", str(folder / name)]).checkpoint)
            for name in ("prune.toml", "quantize.toml", "scorecard.toml")}
    assert len(trained) == 1 and read == trained


@pytest.mark.parametrize("name", ["train-fsdp.toml", "train-tp.toml"])
def test_init_from_none_trains_the_files_model_from_random_weights(name):
    """Offline: `--init-from none` unsets the file's hub model and keeps its size, never the `tiny` default."""
    path = ROOT / "configs/gpt2-medium-wikitext103" / name
    for value in ("none", ""):
        cfg = parse_config(TrainConfig, "train", ["--config", str(path), "--init-from", value])
        assert (cfg.init_from, cfg.model) == (None, "gpt2-medium")
        cfg.check_model_named(given_fields(TrainConfig, ["--config", str(path), "--init-from", value]))


def test_init_from_none_without_a_model_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "fine-tune.toml"
    path.write_text('init-from = "gpt2-medium"\ndataset = "builtin"\n')
    for argv in (["--config", str(path), "--init-from", "none"], ["--init-from", "none"]):
        with pytest.raises(SystemExit) as refused:
            train_main([*argv, "--out-dir", str(tmp_path / "run")])
        assert str(refused.value.code).startswith("error: --init-from none trains from random weights, and no --model "
                                                  "names their size; give --model (tiny, ")
    path.write_text('init-from = "none"\nmodel = "tiny"\n')
    cfg = parse_config(TrainConfig, "train", ["--config", str(path)])
    assert (cfg.init_from, cfg.model) == (None, "tiny")
    assert not (tmp_path / "run").exists()


def test_make_demo_runs_the_demo_configs():
    from bench.demo import SIZES, stages
    commands = [" ".join(stage.command) for stage in stages(SIZES["demo"], ROOT / "out/demo")]
    for path in (ROOT / "configs/demo").glob("*.toml"):
        assert any(f"--config configs/demo/{path.name}" in command for command in commands), \
            f"make demo does not run {path.name}"
