"""`--config FILE.toml` (runtime/cli.py): every tool's settings from a file, flags overriding it, and any mistake
in the file one line naming the file and the key."""
from __future__ import annotations

import dataclasses
import os

import pytest

from bench.eval.scorecard import LeaderboardConfig
from prune.config import PruneConfig
from quantize.dynamic import QuantizeConfig
from runtime.cli import ConfigFileError, flag, given_fields, parse_config
from serve.config import ServeConfig
from tests.config_toml import write_toml
from training.config import TrainConfig

TOOLS = {"train.py": TrainConfig, "prune/iterative.py": PruneConfig, "quantize/dynamic.py": QuantizeConfig,
         "bench/leaderboard.py": LeaderboardConfig, "python -m serve": ServeConfig}

REQUIRED = {PruneConfig: {"target": 0.5}}  # a setting with no default


def parse(cls, argv):
    return parse_config(cls, "A tool.", argv, prog="tool")


def test_the_file_sets_what_it_names_and_a_flag_on_the_command_line_overrides_it(tmp_path):
    path = write_toml(tmp_path / "run.toml", {"model": "gpt2", "batch-size": 4, "lr": 3e-5, "compile": True,
                                              "out-dir": "out/x"})
    cfg = parse(TrainConfig, ["--config", str(path), "--batch-size", "8", "--no-compile"])
    assert (cfg.model, cfg.batch_size, cfg.lr, cfg.compile, str(cfg.out_dir)) == ("gpt2", 8, 3e-5, False, "out/x")
    assert cfg == parse(TrainConfig, ["--model", "gpt2", "--batch-size", "8", "--lr", "3e-5", "--out-dir", "out/x"])


@pytest.mark.parametrize("prog", list(TOOLS))
def test_keys_with_underscores_read_as_the_flags_spelling(prog, tmp_path):
    """`max_steps = 2` (nanoGPT's, torchtitan's and Hugging Face's spelling, and the flag's dest) is `max-steps = 2`."""
    cls, required = TOOLS[prog], REQUIRED.get(TOOLS[prog], {})
    reference = cls(**required)
    settings = {f.name: getattr(reference, f.name) for f in dataclasses.fields(cls)
                if getattr(reference, f.name) is not None}
    dashed = write_toml(tmp_path / "dashed.toml", {flag(name)[2:]: value for name, value in settings.items()})
    underscored = write_toml(tmp_path / "underscored.toml", settings)
    assert parse(cls, ["--config", str(underscored)]) == parse(cls, ["--config", str(dashed)]) == reference
    assert given_fields(cls, ["--config", str(underscored)]) == given_fields(cls, ["--config", str(dashed)])


def test_a_key_of_the_file_counts_as_given_as_its_flag_would(tmp_path):
    """train.py lets a resumed run take over the settings the user gave: a key in the file is one of them."""
    path = write_toml(tmp_path / "run.toml", {"max-steps": 30, "eval-interval": 10})
    assert given_fields(TrainConfig, ["--config", str(path), "--seed", "3"]) == {"max_steps", "eval_interval", "seed"}
    assert given_fields(TrainConfig, ["--seed", "3"]) == {"seed"}


@pytest.mark.parametrize("prog", list(TOOLS))
def test_every_default_written_to_a_file_reads_back_as_the_default(prog, tmp_path):
    """Each type a flag takes (int, float, str, a path, a bool, a list) is spelt in TOML as its flag's value."""
    cls, required = TOOLS[prog], REQUIRED.get(TOOLS[prog], {})
    reference = cls(**required)
    settings = {flag(f.name)[2:]: getattr(reference, f.name) for f in dataclasses.fields(cls)}
    path = write_toml(tmp_path / "defaults.toml", {key: value for key, value in settings.items() if value is not None})
    assert parse(cls, ["--config", str(path)]) == reference


@pytest.mark.parametrize("text, message", [
    ("batch_sise = 4", "unknown key 'batch_sise', did you mean batch-size?"),
    ("batch-sise = 4", "unknown key 'batch-sise', did you mean batch-size?"),
    ("batch_size = 4\nbatch-size = 4", "'batch_size' and 'batch-size' set the same key; keep one"),
    ('batch_size = "4"', 'batch_size must be an integer, got "4"'),
    ("zzzz = 4", "unknown key 'zzzz'; TrainConfig's keys are the flags of --help"),
    ('batch-size = "4"', 'batch-size must be an integer, got "4"'),
    ("batch-size = 4.0", "batch-size must be an integer, got 4.0"),
    ("batch-size = true", "batch-size must be an integer, got true"),
    ("batch-size = 0", "batch-size must be at least 1, got 0"),
    ("dropout = nan", "dropout must be at least 0, got nan"),
    ("compile = 1", "compile must be true or false, got 1"),
    ('model = "gpt3"', 'model must be one of tiny, small-cpu, gpt2, gpt2-medium, gpt2-large, gpt2-xl, got "gpt3"'),
    ("[training]\nbatch-size = 4", "unknown key 'training'; TrainConfig's keys are the flags of --help"),
    ("batch-size = ", "not valid TOML: Invalid value (at line 1, column 14)"),
    # a string field never takes a TOML number as its text (the mutant of issue 71 that did survived)
    ("dataset = 7", "dataset must be a string, got 7"),
    ("device = 0", "device must be a string, got 0"),
    ('out-dir = "x\\u0000y"', "out-dir holds a NUL character (\\u0000), which no flag can carry; remove it"),
    ('dataset = ["a\\u0000"]', "dataset must be a string, got [\"a\\u0000\"]"),
    ("batch-size = " + "1" * 4301, "holds an integer of more than 4300 digits"),
    ("out-dir = " + "[" * 100_000 + "]" * 100_000, "nested deeper than the parser can follow; arrays and tables must "
                                                   "not nest so deep"),
    ("out-dir = " + "{a = " * 20_000 + "1" + "}" * 20_000, "nested deeper than the parser can follow; arrays and "
                                                           "tables must not nest so deep"),
])
def test_a_mistake_in_the_file_is_one_line_naming_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "run.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigFileError) as error:
        parse(TrainConfig, ["--config", str(path)])
    assert str(error.value) == f"{path}: {message}"


def test_a_check_across_settings_names_the_key_the_file_set(tmp_path):
    path = write_toml(tmp_path / "run.toml", {"lr": float("inf")})
    with pytest.raises(ConfigFileError) as error:
        parse(TrainConfig, ["--config", str(path)])
    assert str(error.value) == f"--lr must be a finite number, got inf (lr is set in {path})"


def test_a_file_that_cannot_be_read_is_one_line(tmp_path):
    with pytest.raises(ConfigFileError, match=r"^--config .*missing\.toml: no such file$"):
        parse(TrainConfig, ["--config", str(tmp_path / "missing.toml")])
    with pytest.raises(ConfigFileError, match="is a folder; name a .toml file$"):
        parse(TrainConfig, ["--config", str(tmp_path)])
    os.mkfifo(tmp_path / "fifo.toml")  # opening it would wait for a writer forever
    with pytest.raises(ConfigFileError, match=r"fifo\.toml: not a regular file; name a \.toml file$"):
        parse(TrainConfig, ["--config", str(tmp_path / "fifo.toml")])
    (tmp_path / "latin1.toml").write_bytes(b'prompt = "caf\xe9"\n')
    with pytest.raises(ConfigFileError, match=r"latin1\.toml: not UTF-8 text \(byte 13\); TOML files are UTF-8$"):
        parse(TrainConfig, ["--config", str(tmp_path / "latin1.toml")])


@pytest.mark.parametrize("prog", list(TOOLS))
def test_help_lists_config(prog, capsys):
    with pytest.raises(SystemExit):
        parse(TOOLS[prog], ["--help"])
    assert "--config FILE.toml" in capsys.readouterr().out
