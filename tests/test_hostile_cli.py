"""Hostile command lines and `--config` files against every tool's parser (runtime/cli.py, tests/hostile.py's
property): any argv, and any TOML file, either parses into the tool's config or stops with one `error:` line --
never a traceback, never the usage dump -- a flag is never taken for another it abbreviates, and a refused file
is named in its line."""
from __future__ import annotations

import dataclasses
import importlib.machinery
import json
import sys
import tempfile
import types
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sample
import train
from bench.experiment import SettingsError
from bench import demo
from bench.experiments import fused_step, generate_speed, prefix_cache, serve_speed, user_start
from bench.standalone import huge_pages_one_off
from bench.standalone.async_steps import AsyncStepsConfig
from bench.standalone.eval_loss import EvalLossConfig
from bench.standalone.greedy_argmax import GreedyArgmaxConfig
from bench.standalone.joining_batch import JoiningBatchConfig
from bench.standalone.kernels_in_step import KernelsInStepConfig
from bench.standalone.multi_device import MultiDeviceConfig
from bench.standalone.serve_cpu_split import ServeCpuSplitConfig
from bench.standalone.shard_memory import ShardMemoryConfig
from bench.standalone.static_cache_width import StaticCacheWidthConfig
from bench.standalone.stop_time import StopTimeConfig
from bench.standalone.stream_interval import StreamIntervalConfig
from bench.standalone.train_step_profile import TrainStepProfileConfig
from bench.eval.scorecard import LeaderboardConfig
from bench.eval.perplexity import PerplexityConfig
from prune.config import PruneConfig
from quantize.dynamic import QuantizeConfig
from runtime.cli import ConfigFileError, flag, given_fields, parse_config
from serve.config import ServeConfig
from tests.config_toml import literal
from runtime.errors import UserError
from tests.hostile import attempt, check_error_line, examples

CLI = "command line"
CONFIG_FILE = "config file"
TOOLS = {"train.py": train.TrainConfig, "sample.py": sample.SampleConfig, "python -m serve": ServeConfig,
         "quantize/dynamic.py": QuantizeConfig, "bench/eval/perplexity.py": PerplexityConfig,
         "bench/leaderboard.py": LeaderboardConfig, "prune/iterative.py": PruneConfig,
         "python -m bench.demo": demo.DemoConfig,
         # the settings of the experiments that start peers and busy processes
         "generate_speed": generate_speed.Settings, "serve_speed": serve_speed.Settings,
         "prefix_cache": prefix_cache.Settings, "user_start": user_start.Settings,
         "fused_step": fused_step.Settings,
         # the measurements run by hand (bench/standalone/)
         "bench.standalone.greedy_argmax": GreedyArgmaxConfig, "bench.standalone.serve_cpu_split": ServeCpuSplitConfig,
         "bench.standalone.huge_pages_one_off": huge_pages_one_off.Config,
         "bench.standalone.stop_time": StopTimeConfig, "bench.standalone.stream_interval": StreamIntervalConfig,
         "bench.standalone.kernels_in_step": KernelsInStepConfig,
         "bench.standalone.shard_memory": ShardMemoryConfig, "bench.standalone.multi_device": MultiDeviceConfig,
         "bench.standalone.async_steps": AsyncStepsConfig,
         "bench.standalone.static_cache_width": StaticCacheWidthConfig,
         "bench.standalone.joining_batch": JoiningBatchConfig, "bench.standalone.eval_loss": EvalLossConfig,
         "bench.standalone.train_step_profile": TrainStepProfileConfig}
VALUES = ("0", "-1", "1", "90", "1e309", "nan", "inf", "0.5", "", "--", "-", "=", "yes", "auto", "builtin", "none")


def flags_of(cls) -> list[str]:
    return [flag(f.name) for f in dataclasses.fields(cls)]


@st.composite
def words(draw, cls) -> str:
    """One argv word: a flag of the tool (whole, cut short, misspelt, or with `=value`), a value, or any text."""
    name = draw(st.sampled_from(flags_of(cls)))
    kind = draw(st.sampled_from(("flag", "flag", "prefix", "typo", "assigned", "value", "text")))
    if kind == "prefix":
        return name[:draw(st.integers(3, max(3, len(name) - 1)))]
    if kind == "typo":
        at = draw(st.integers(2, len(name) - 1))
        return name[:at] + draw(st.characters(codec="utf-8")) + name[at + 1:]
    if kind == "assigned":
        return f"{name}={draw(st.sampled_from(VALUES) | st.text(max_size=8))}"
    if kind == "value":
        return draw(st.sampled_from(VALUES))
    return draw(st.text(max_size=12)) if kind == "text" else name


@pytest.mark.parametrize("prog", list(TOOLS))
@examples(60)
@given(data=st.data())
def test_any_command_line_parses_or_is_one_error_line(prog, data):
    cls = TOOLS[prog]
    argv = data.draw(st.lists(words(cls), max_size=6))
    attempt(CLI, lambda: parse_config(cls, "A tool.", argv, prog=prog))
    if prog == "train.py":  # train.py reads the command line twice: its config, then the flags it names
        attempt(CLI, lambda: given_fields(cls, argv))


@pytest.mark.parametrize("prog", list(TOOLS))
def test_a_flag_cut_short_is_refused_never_taken_for_the_whole(prog):
    flags = flags_of(TOOLS[prog])
    for short in {name[:-1] for name in flags} - set(flags):
        with pytest.raises(SystemExit) as exit_info:
            parse_config(TOOLS[prog], "A tool.", [short, "1"], prog=prog)
        assert exit_info.value.code.startswith(f"error: unknown flag {short}, did you mean --")


# TOML values of every kind, in and out of every field's type and bounds: integers at 64-bit's ends, floats beyond
# them, strings a choice may or may not hold, arrays (empty, mixed), tables and dates.
TOML_VALUES = ("0", "-1", "1", "90", "9223372036854775807", "-9223372036854775808", "1e309", "nan", "-inf", "0.5",
               "1.0", '""', '"--"', '"auto"', '"builtin"', '"none"', '"yes"', '"tiny"', '"fsdp"', "true", "false",
               "[]", "[1, 2]", '["ddp", "tp"]', '[1, "a"]', "{a = 1}", "1979-05-27", "07:32:00", "'\\'")


@st.composite
def toml_entries(draw, cls) -> tuple[str, str]:
    """A key (a field's, misspelt, with underscores, or any text) and a value (a TOML literal, any typed value, or any
    text, which may not be TOML at all)."""
    name = draw(st.sampled_from(flags_of(cls)))[2:]
    key = draw(st.sampled_from((name, name, name.replace("-", "_"), name[:-1])) | st.text(max_size=10))
    value = draw(st.sampled_from(TOML_VALUES)
                 | st.one_of(st.integers(), st.floats(), st.booleans(), st.text(max_size=8)).map(literal)
                 | st.text(max_size=8))
    return key, value


def toml_line(key: str, value: str) -> str:
    return f"{json.dumps(key)} = {value}"


def toml_lines(cls):
    """One line of a config file (toml_entries)."""
    return toml_entries(cls).map(lambda entry: toml_line(*entry))


@pytest.mark.parametrize("prog", list(TOOLS))
@examples(40)
@given(data=st.data())
def test_any_config_file_parses_or_is_one_error_line_naming_the_file(prog, data):
    cls = TOOLS[prog]
    text = "\n".join(data.draw(st.lists(toml_lines(cls), max_size=5))) + "\n"
    flags = data.draw(st.lists(words(cls), max_size=2))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "run.toml"
        content = text.encode("utf-8", "surrogatepass")  # a drawn lone surrogate makes a file that is not UTF-8
        path.write_bytes(content)
        argv = ["--config", str(path), *flags]

        def parse():
            try:
                parse_config(cls, "A tool.", argv, prog=prog)
            except ConfigFileError as e:
                assert str(path) in str(e), f"a refused config file is named in its line: {e}"
                raise

        attempt(CONFIG_FILE, parse)
        if prog == "train.py":
            attempt(CONFIG_FILE, lambda: given_fields(cls, argv))
        assert path.read_bytes() == content  # read, never changed


@pytest.mark.parametrize("prog", list(TOOLS))
@examples(20)
@given(data=st.data())
def test_a_keys_spelling_with_dashes_or_underscores_changes_nothing(prog, data):
    """The same file with its keys' dashes written as underscores reads the same, or is refused the same way, and an
    unknown key's line suggests the same flag in either spelling."""
    cls = TOOLS[prog]
    entries = data.draw(st.lists(toml_entries(cls), max_size=4))
    outcomes = []
    with tempfile.TemporaryDirectory() as folder:
        for name, spell in (("dashed", lambda key: key.replace("_", "-")),
                            ("underscored", lambda key: key.replace("-", "_"))):
            path = Path(folder) / f"{name}.toml"
            text = "".join(toml_line(spell(key), value) + "\n" for key, value in entries)
            path.write_bytes(text.encode("utf-8", "surrogatepass"))
            try:
                outcomes.append(parse_config(cls, "A tool.", ["--config", str(path)], prog=prog))
            except (UserError, SystemExit) as e:  # the file's line, or a check across settings
                outcomes.append(str(e).replace(str(path), "FILE").replace("_", "-"))
    assert outcomes[0] == outcomes[1]


# Values Python's parsers cannot take as they take others: nesting past the interpreter's stack (a RecursionError)
# and integers past its 4,300 digits (a ValueError), and a NUL that no command line can carry, in a key of each
# type each tool's config has.
def past_the_parsers(key: str) -> list[str]:
    return [f"{key} = " + "[" * 100_000 + "]" * 100_000, f"{key} = " + "{a = " * 20_000 + "1" + "}" * 20_000,
            f"{key} = " + "9" * 4301, f"{key} = -" + "9" * 10_000, f'{key} = "x\\u0000y"',
            f'{key} = ["x", "\\u0000"]']


@pytest.mark.parametrize("prog", list(TOOLS))
def test_config_values_past_the_parsers_limits_are_one_error_line_naming_the_file(prog, tmp_path):
    cls = TOOLS[prog]
    one_per_type = {str(f.type): flag(f.name)[2:] for f in reversed(dataclasses.fields(cls))}
    for key in one_per_type.values():
        for text in past_the_parsers(key):
            path = tmp_path / "run.toml"
            path.write_text(text + "\n")

            def parse():
                try:
                    parse_config(cls, "A tool.", ["--config", str(path)], prog=prog)
                except ConfigFileError as e:
                    assert str(path) in str(e) and len(str(e)) < 300, f"one short line naming the file: {e}"
                    raise

            assert attempt(CONFIG_FILE, parse) == "refused", (key, text[:40])


SAMPLE_JSON = "sample.py JSON"


@st.composite
def json_past_the_parsers(draw) -> tuple[str, str]:
    """A --logit-bias value or a --prompts-file line of drawn digits and depth: ("flag" or "line", its text)."""
    digits, depth = "1" * draw(st.integers(1, 12_000)), draw(st.integers(1, 150_000))
    nested = "[" * depth + "]" * depth
    return draw(st.sampled_from([
        ("flag", '{"' + digits + '": 1}'), ("flag", nested), ("flag", '{"1": ' + digits + "}"),
        ("line", json.dumps({"prompt": "a", "logit_bias": {digits: 1}})), ("line", '{"prompt": "a", "seed": -' + digits + "}"),
        ("line", '{"prompt": ' + nested + "}"), ("line", '{"prompt": "a", "logit_bias": ' + nested + "}"),
        *[("line", f'{{"prompt": "a", "{key}": {digits}}}') for key in sample.PROMPT_SETTINGS if key != "logit_bias"],
        ("line", '{"prompt": "a", "logit_bias": {"1": -' + digits + "}}")]))


@examples(30)
@given(case=json_past_the_parsers())
def test_sample_json_of_any_length_and_depth_is_one_line_and_a_bad_prompts_line_fails_alone(case):
    where, text = case
    if where == "flag":
        attempt(SAMPLE_JSON, lambda: sample.SampleConfig(logit_bias=text))
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "prompts.jsonl"
        path.write_text(text + "\n" + json.dumps({"prompt": "fine"}) + "\n")
        read = {}
        attempt(SAMPLE_JSON, lambda: read.update(lines=sample.read_prompts(sample.SampleConfig(prompts_file=str(path)))))
        jobs, errors = read["lines"]
        assert [number for number, *_ in jobs][-1:] == [2]  # the good line after it still runs
        for error in errors:
            check_error_line(error["error"], SAMPLE_JSON)


@pytest.mark.parametrize("baseline", ["-o/tmp/x", "--remote=x", "no-such-revision", "HEAD:README.md", ""])
def test_a_baseline_that_is_not_a_commit_is_one_error_line(baseline):
    with pytest.raises(SettingsError) as error:
        parse_config(generate_speed.Settings, "A tool.", [f"--baseline={baseline}"], prog="generate_speed")
    assert str(error.value).startswith(f"--baseline {baseline!r} is not a commit of this repository")
    assert "\n" not in str(error.value)
    assert parse_config(generate_speed.Settings, "A tool.", ["--baseline", "HEAD"], prog="generate_speed").baseline


@pytest.mark.parametrize("prog", ["serve_speed", "prefix_cache"])
def test_a_llama_server_that_cannot_run_is_one_error_line_before_any_measuring(prog, tmp_path, monkeypatch):
    binary = tmp_path / "llama-server"

    def refusal() -> str:
        with pytest.raises(SettingsError) as error:
            parse_config(TOOLS[prog], "A tool.", ["--llama-server", str(binary)], prog=prog)
        assert "\n" not in str(error.value)
        return str(error.value)

    assert refusal().startswith(f"--llama-server {binary} is not a file; build llama.cpp's llama-server")
    binary.write_text("")
    monkeypatch.setitem(sys.modules, "gguf", None)  # not installed, as in the project's .venv
    assert refusal().startswith("--llama-server needs the gguf package")
    gguf = types.ModuleType("gguf")
    gguf.__spec__ = importlib.machinery.ModuleSpec("gguf", None)
    monkeypatch.setitem(sys.modules, "gguf", gguf)  # installed, as in .peers/venv
    assert parse_config(TOOLS[prog], "A tool.", ["--llama-server", str(binary)], prog=prog).llama_server == str(binary)


@pytest.mark.parametrize("tool, argv, line", [
    ("greedy_argmax", ["--rows", "0"], "error: --rows must be at least 1, got 0"),
    ("greedy_argmax", ["--rows", "--calls", "1"], "error: argument --rows: expected at least one argument"),
    ("greedy_argmax", ["--calls", "-1"], "error: --calls must be at least 1, got -1"),
    ("stream_interval", ["--intervals-ms", "20", "20"], "error: --intervals-ms names an interval twice: 20.0 20.0"),
    ("stream_interval", ["--intervals-ms", "1000.5"], "error: --intervals-ms must be at most 1000, got 1000.5"),
    ("stream_interval", ["--requests", "0"], "error: --requests must be at least 1, got 0"),
    ("stream_interval", ["--device", "nonsense"], "error: --device 'nonsense' is not a device"),
    ("stream_interval", ["--device", "meta"], "error: --weights int8 runs PyTorch's int8 kernels, which are CPU-only"),
    ("kernels_in_step", ["--new-tokens", "2000"],
     "error: --new-tokens 2000 after a 32-token prompt exceeds the 1024 positions of gpt2; ask for at most 992"),
    ("kernels_in_step", ["--rows", "0"], "error: --rows must be at least 1, got 0"),
    ("train_step_profile", ["--nanogpt", "/no/such/checkout"],
     "error: --nanogpt /no/such/checkout has no model.py; give the path of a karpathy/nanoGPT checkout"),
    ("train_step_profile", ["--shape", "gpt9:1x8"], "error: --shape 'gpt9:1x8': no preset 'gpt9'; choose from"),
    ("train_step_profile", ["--profile-steps", "0"], "error: --profile-steps must be at least 1, got 0"),
    ("joining_batch", ["--batch-sizes", "17"], "error: --batch-sizes must be at most 16, got 17"),
    ("joining_batch", ["--steps", "1000"], "error: --prompt-tokens 32 and --steps 1000 overflow the gpt2 context "
                                           "of 1024; ask for fewer"),
    ("eval_loss", ["--block-size", "2000"], "error: --block-size 2000 is longer than the gpt2 context of 1024; ask "
                                            "for fewer"),
    ("eval_loss", ["--block-size", "1"], "error: --block-size must be at least 2, got 1")])
def test_a_standalone_measurement_refuses_settings_before_measuring_and_writes_nothing(tool, argv, line, tmp_path,
                                                                                       capsys):
    """Settings that time nothing (greedy_argmax), that no server can take (stream_interval) or no model holds
    (kernels_in_step): one error line before a host rate is measured or a server started, and no results file."""
    main = importlib.import_module(f"bench.standalone.{tool}").main
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--results-dir", str(tmp_path)])
    said = (str(stopped.value.code) if isinstance(stopped.value.code, str) else "") + capsys.readouterr().err
    assert len(said.strip().splitlines()) == 1 and said.startswith(line) and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("prog, argv", [
    ("python -m serve", ["--async-steps", "on", "--draft", "some/draft"]),
    ("python -m serve", ["--draft=d", "--async-steps=on", "--draft-tokens", "2"]),
    ("serve_speed", ["--async-steps", "off", "on", "off"]),
    ("serve_speed", ["--async-steps", "soon"]),
])
def test_steps_launched_ahead_where_they_cannot_be_are_one_error_line(prog, argv):
    """Asynchronous steps with a draft (whose speculative steps read each row's kept tokens before the next), a
    setting timed twice, a setting that is none: refused in one line naming --async-steps."""
    assert attempt(CLI, lambda: parse_config(TOOLS[prog], "A tool.", argv, prog=prog)) == "refused"
    with pytest.raises((SystemExit, UserError)) as refusal:
        parse_config(TOOLS[prog], "A tool.", argv, prog=prog)
    assert "--async-steps" in str(refusal.value.code if isinstance(refusal.value, SystemExit) else refusal.value)
