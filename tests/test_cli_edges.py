"""runtime/cli.py at its edges, on a small settings class of every kind of field: each `--config` value's exact
refusal, the file key a check across settings blames, the flags that rebuild a config, the parser's one-line
refusals in the plural, and values shown cut short -- so that a changed condition or message in the module fails
here in a second."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from runtime.cli import (ConfigFileError, ToolParser, _base_type, _shown, add_dataclass_args, check_options,
                         given_fields, non_default_fields, non_default_flags, option, parse_config, printable,
                         read_config_file, to_flags)
from runtime.errors import UserError


class SettingsError(UserError):
    pass


class Word(str):
    """A string type whose constructor refuses some values, as Path or an enum's would."""

    def __new__(cls, value):
        if not value.isalpha():
            raise ValueError(f"{value!r} is not a word")
        return super().__new__(cls, value)


@dataclass
class Settings:
    max_steps: int = option(10, "steps", min=1)
    rate: float = option(0.5, "rate", above=0, max=1)
    name: str = option("a", "name", choices=["a", "b"])
    out: Path = option(Path("out"), "folder")
    fast: bool = option(False, "fast")
    sizes: list[int] = option([1], "sizes", min=1)
    tags: list[str] = option([], "tags", may_be_empty=True, choices=["x", "y"])
    word: Word = option(Word("hello"), "a word")
    context: int | None = option(None, "window", min=2)

    def __post_init__(self):
        check_options(self, SettingsError)
        if self.max_steps < max(self.sizes):
            raise SettingsError(f"--max-steps {self.max_steps} is below the largest of --sizes, {max(self.sizes)}")


def config_file(tmp_path, text: str) -> Path:
    path = tmp_path / "settings.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, problem", [
    ("max-steps = 0", "max-steps must be at least 1, got 0"),
    ("max-steps = 2.0", "max-steps must be an integer, got 2.0"),
    ('max-steps = "2"', 'max-steps must be an integer, got "2"'),
    ("max-steps = true", "max-steps must be an integer, got true"),
    ("max-steps = [2]", "max-steps must be an integer, got [2]"),
    ("max-steps = {a = 1}", 'max-steps must be an integer, got {"a": 1}'),
    ("rate = 0", "rate must be above 0, got 0.0"),
    ("rate = 1.5", "rate must be at most 1, got 1.5"),
    ('rate = "0.5"', 'rate must be a number, got "0.5"'),
    ("rate = false", "rate must be a number, got false"),
    ('name = "c"', 'name must be one of a, b, got "c"'),
    ("name = 1", "name must be a string, got 1"),
    ("name = [\"a\"]", 'name must be a string, got ["a"]'),
    ("out = 5", "out must be a string, got 5"),
    ("out = true", "out must be a path (a string), got true"),
    ("fast = 1", "fast must be true or false, got 1"),
    ('fast = "yes"', 'fast must be true or false, got "yes"'),
    ("sizes = 4", "sizes must be a list, got 4"),
    ("sizes = []", "sizes needs at least one value"),
    ("sizes = [1, 0]", "sizes must be at least 1, got 0"),
    ('sizes = [1, "2"]', 'sizes must be an integer, got "2"'),
    ('tags = ["x", "z"]', 'tags must be one of x, y, got "z"'),
    ('word = "two words"', "word is not a valid value: 'two words' is not a word"),
    ("context = 1", "context must be at least 2, got 1"),
])
def test_each_wrong_value_in_a_config_file_is_named_with_its_key_and_why(tmp_path, text, problem):
    path = config_file(tmp_path, text)
    with pytest.raises(ConfigFileError) as refused:
        read_config_file(Settings, path)
    assert str(refused.value) == f"{path}: {problem}"


def test_the_values_a_config_file_gives_are_the_fields_types(tmp_path):
    path = config_file(tmp_path, 'max-steps = 20\nrate = 1\nname = "b"\nout = "runs/x"\nfast = true\nsizes = [2, 3]\n'
                                 'tags = []\nword = "hi"\ncontext = 2\n')
    settings = read_config_file(Settings, path)
    assert settings == {"max_steps": 20, "rate": 1.0, "name": "b", "out": Path("runs/x"), "fast": True,
                        "sizes": [2, 3], "tags": [], "word": "hi", "context": 2}
    assert isinstance(settings["rate"], float) and isinstance(settings["out"], Path)


def test_an_unknown_key_is_named_with_the_nearest_or_where_the_keys_are(tmp_path):
    for key in ("max_stepz", "max-stepz"):  # either spelling, the same line
        path = config_file(tmp_path, f"{key} = 3")
        with pytest.raises(ConfigFileError, match=rf": unknown key '{key}', did you mean max-steps\?$"):
            read_config_file(Settings, path)
    path = config_file(tmp_path, "zzzzzz = 3")
    with pytest.raises(ConfigFileError) as refused:
        read_config_file(Settings, path)
    assert str(refused.value) == f"{path}: unknown key 'zzzzzz'; Settings's keys are the flags of --help"


def test_a_check_across_settings_names_the_key_the_file_set(tmp_path):
    path = config_file(tmp_path, "max-steps = 2\nsizes = [5]\n")
    with pytest.raises(ConfigFileError) as refused:
        parse_config(Settings, "settings", ["--config", str(path)])
    assert str(refused.value) == f"--max-steps 2 is below the largest of --sizes, 5 (max-steps is set in {path})"
    with pytest.raises(ConfigFileError) as refused:
        parse_config(Settings, "settings", ["--config", str(path), "--max-steps", "3"])
    assert str(refused.value) == f"--max-steps 3 is below the largest of --sizes, 5 (sizes is set in {path})"
    with pytest.raises(SettingsError) as refused:  # both on the command line: the file is not to blame
        parse_config(Settings, "settings", ["--config", str(path), "--max-steps", "3", "--sizes", "4"])
    assert type(refused.value) is SettingsError
    loaded = parse_config(Settings, "settings", ["--config", str(path), "--sizes", "1", "--rate", "0.25"])
    assert (loaded.max_steps, loaded.sizes, loaded.rate) == (2, [1], 0.25)  # the file, less what the line overrides


def test_the_fields_given_are_those_on_the_line_and_in_the_file(tmp_path):
    path = config_file(tmp_path, "rate = 0.25\nname = \"b\"\n")
    assert given_fields(Settings, ["--config", str(path), "--max-steps", "4"]) == {"rate", "name", "max_steps"}
    assert given_fields(Settings, ["--fast"]) == {"fast"}
    assert given_fields(Settings, []) == set()


def test_a_config_and_the_flags_that_rebuild_it():
    changed = Settings(max_steps=20, fast=True, sizes=[1, 2], context=None, tags=["x"])
    assert non_default_fields(changed) == ["max_steps", "fast", "sizes", "tags"]
    assert non_default_flags(changed) == ["--max-steps", "20", "--fast", "--sizes", "1", "2", "--tags", "x"]
    assert non_default_fields(Settings()) == [] and non_default_flags(Settings()) == []
    assert to_flags({"batch_size": 4, "compile": True, "resume": False, "init_from": None, "modes": ("ddp", "tp"),
                     "out": Path("a b")}) == ["--batch-size", "4", "--compile", "--no-resume", "--modes", "ddp", "tp",
                                              "--out", "a b"]
    rebuilt = parse_config(Settings, "settings", non_default_flags(changed))
    assert rebuilt == changed


def test_an_optional_field_takes_the_type_it_wraps():
    assert _base_type(int | None) is int and _base_type(Optional[str]) is str and _base_type(None | float) is float
    assert _base_type(list[int]) == list[int] and _base_type(Path) is Path and _base_type(int | str) == int | str


def test_text_is_shown_on_one_line_and_a_long_value_cut_at_sixty_characters():
    assert printable("a\nb\tc\x00é") == "a\\nb\\tc\\x00é"
    assert _shown("x" * 58) == '"' + "x" * 58 + '"'  # 60 with its quotes: whole
    assert _shown("x" * 59) == '"' + "x" * 56 + "..."  # 61: cut to 57 and the dots
    assert _shown("é\n") == '"é\\n"' and _shown(Path("a")) == '"a"' and _shown([1, True]) == "[1, true]"


def test_the_parser_refuses_in_one_line_every_word_it_cannot_place():
    parser = ToolParser(prog="tool")
    add_dataclass_args(parser, Settings)
    for argv, message in [(["1", "2"], "unexpected arguments 1 2"), (["7"], "unexpected argument 7"),
                          (["--max-stepz", "1", "--rat=2"], "unknown flag --max-stepz, did you mean --max-steps?; "
                                                             "unknown flag --rat, did you mean --rate?")]:
        with pytest.raises(SystemExit) as refused:
            parser.parse_args(argv)
        assert refused.value.code == f"error: {message} (see `tool --help`)"


@dataclass
class Shapes:
    runs: list[str] = option([], "run folders", positional=True, may_be_empty=True)
    resume: str = option("no", "resume", bare="yes", choices=["no", "yes", "auto"])
    modes: list[str] = option(["ddp"], "modes", choices=["ddp", "tp"])
    seed: int | None = option(None, "seed")


def test_each_shape_of_field_parses_as_its_help_says():
    parser = ToolParser(prog="tool")
    add_dataclass_args(parser, Shapes)
    parsed = parser.parse_args(["a", "b", "--resume", "--modes", "ddp", "tp", "--seed", "3"])
    assert (parsed.runs, parsed.resume, parsed.modes, parsed.seed) == (["a", "b"], "yes", ["ddp", "tp"], 3)
    parsed = parser.parse_args([])
    assert (parsed.runs, parsed.resume, parsed.modes, parsed.seed) == ([], "no", ["ddp"], None)
    assert parser.parse_args(["--resume", "auto"]).resume == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--modes", "pp"])
    help_text = " ".join(parser.format_help().split())
    assert "resume (default: no)" in help_text and "seed" in help_text and "seed (default" not in help_text
    sparse = argparse.ArgumentParser()
    add_dataclass_args(sparse, Shapes, defaults=False)
    assert vars(sparse.parse_args(["--seed", "4"])) == {"seed": 4}  # what is not given is not there
