"""Hostile command lines against every tool's parser (runtime/cli.py, tests/hostile.py's property): any argv
either parses into the tool's config or stops with one `error:` line -- never a traceback, never the usage dump,
and a flag is never taken for another it abbreviates."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sample
import train
from bench import demo
from bench.experiments import generate_speed, serve_speed
from bench.eval.scorecard import LeaderboardConfig
from bench.eval.perplexity import PerplexityConfig
from prune.config import PruneConfig
from quantize.dynamic import QuantizeConfig
from runtime.cli import flag, given_fields, parse_config
from serve.config import ServeConfig
from tests.hostile import attempt, examples

CLI = "command line"
TOOLS = {"train.py": train.TrainConfig, "sample.py": sample.SampleConfig, "python -m serve": ServeConfig,
         "quantize/dynamic.py": QuantizeConfig, "bench/eval/perplexity.py": PerplexityConfig,
         "bench/leaderboard.py": LeaderboardConfig, "prune/iterative.py": PruneConfig,
         "python -m bench.demo": demo.DemoConfig,
         # the settings of the experiments that start peers and busy processes
         "generate_speed": generate_speed.Settings, "serve_speed": serve_speed.Settings}
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
