"""runtime/cli.py: bounded options (one message form for an out-of-range flag in every tool), the parser's one-line
refusals and `entry_point`, the wrapper of every command's `main`."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import pytest

from bench.experiments.prune_speed import Settings as PruneSpeedSettings
from bench.eval.scorecard import LeaderboardConfig
from prune.config import PruneConfig
from prune.errors import PruneError
from quantize.dynamic import QuantizeConfig, QuantizeError
from runtime.cli import add_dataclass_args, check_options, entry_point, option, parse_config
from runtime.errors import UserError
from runtime.stopping import Stopped, leaving
from serve.config import ServeConfig, ServeConfigError
from tests.source_tree import ROOT, parsed, python_files
from training.config import TrainConfig, TrainingError


class DemoError(UserError):
    pass


@dataclass
class Demo:
    batch_size: int = option(8, "rows", min=1)
    lr: float = option(1e-3, "step size", above=0)
    dropout: float = option(0.0, "probability", min=0, below=1)
    port: int = option(8000, "TCP port", min=0, max=65535)
    context: int | None = option(None, "window (default: the model's)", min=2)
    sizes: list[int] = option([1, 2], "batch sizes", min=1)

    def __post_init__(self):
        check_options(self, DemoError)


@pytest.mark.parametrize("settings, message", [
    (dict(batch_size=0), "--batch-size must be at least 1, got 0"),
    (dict(lr=0.0), "--lr must be above 0, got 0.0"),
    (dict(lr=float("nan")), "--lr must be above 0, got nan"),
    (dict(dropout=1.0), "--dropout must be below 1, got 1.0"),
    (dict(port=65536), "--port must be at most 65535, got 65536"),
    (dict(context=1), "--context must be at least 2, got 1"),
    (dict(sizes=[4, 0]), "--sizes must be at least 1, got 0"),
])
def test_a_value_outside_its_bounds_names_the_flag_the_bound_and_the_value(settings, message):
    with pytest.raises(DemoError) as error:
        Demo(**settings)
    assert str(error.value) == message


def test_values_at_the_bounds_and_none_for_not_given_are_accepted():
    Demo(batch_size=1, lr=1e-12, dropout=0.0, port=65535, context=2, sizes=[1])
    Demo(port=0, context=None)


def test_the_help_shows_the_bounds():
    parser = argparse.ArgumentParser()
    add_dataclass_args(parser, Demo)
    text = " ".join(parser.format_help().split())
    assert "rows (at least 1; default: 8)" in text
    assert "probability (at least 0 and below 1; default: 0.0)" in text
    assert "window (default: the model's) (at least 2)" in text


@pytest.mark.parametrize("make, error, message", [
    (lambda: TrainConfig(batch_size=0), TrainingError, "--batch-size must be at least 1, got 0"),
    (lambda: TrainConfig(lr=float("inf")), TrainingError, "--lr must be a finite number, got inf"),
    (lambda: ServeConfig(max_batch_size=0), ServeConfigError, "--max-batch-size must be at least 1, got 0"),
    (lambda: ServeConfig(threads=0), ServeConfigError, "--threads must be at least 1, got 0"),
    (lambda: ServeConfig(stream_interval_ms=-0.5), ServeConfigError, "--stream-interval-ms must be at least 0, got -0.5"),
    (lambda: ServeConfig(stream_interval_ms=1000.5), ServeConfigError,
     "--stream-interval-ms must be at most 1000, got 1000.5"),
    (lambda: QuantizeConfig(threads=-1), QuantizeError, "--threads must be at least 1, got -1"),
    (lambda: PruneConfig(target=1.0), PruneError, "--target must be below 1, got 1.0"),
])
def test_the_tools_refuse_an_out_of_range_flag_in_the_one_form(make, error, message):
    with pytest.raises(error) as raised:
        make()
    assert str(raised.value) == message


def test_the_tools_accept_a_value_at_the_bound():
    TrainConfig(batch_size=1, warmup_steps=0, dropout=0.0, min_lr_ratio=1.0)
    ServeConfig(max_batch_size=1, max_queue=0, threads=1, port=0, stream_interval_ms=0)
    ServeConfig(stream_interval_ms=1000)
    QuantizeConfig(threads=1, repeats=1)
    PruneConfig(target=0.5, threads=1, finetune_steps=0)


@pytest.mark.parametrize("cls", [ServeConfig, QuantizeConfig, PruneConfig, LeaderboardConfig, PruneSpeedSettings])
def test_threads_means_the_same_in_every_tool(cls):
    """Not given (None): torch's own choice; given: at least 1."""
    [field] = [f for f in dataclasses.fields(cls) if f.name == "threads"]
    assert field.default is None and field.metadata["bounds"] == {"min": 1}
    assert "default: torch's choice" in field.metadata["help"]


@pytest.mark.parametrize("argv, message", [
    (["--max-step", "90"], "error: unknown flag --max-step, did you mean --max-steps? (see `train.py --help`)"),
    (["--max-stepz=90"], "error: unknown flag --max-stepz, did you mean --max-steps? (see `train.py --help`)"),
    (["--zzzz"], "error: unknown flag --zzzz (see `train.py --help`)"),
    (["90"], "error: unexpected argument 90 (see `train.py --help`)"),
    (["--model=--"], "error: argument --model: expected a value, got -- (see `train.py --help`)"),  # not []
    (["--batch-size", "x\ny"], "error: argument --batch-size: invalid int value: 'x\\ny' (see `train.py --help`)"),
])
def test_a_command_line_that_does_not_parse_is_one_error_line_with_the_nearest_flag(argv, message):
    """No abbreviations (`--max-step` is not `--max-steps`), and no usage dump: one line, as other refusals."""
    with pytest.raises(SystemExit) as exit_info:
        parse_config(TrainConfig, "train", argv, prog="train.py")
    assert exit_info.value.code == message


def test_python_m_serve_names_itself_in_its_usage(capsys):
    import serve.__main__
    with pytest.raises(SystemExit) as exit_info:
        serve.__main__.main(["--help"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("usage: python -m serve [-h]")


def test_a_bounded_list_needs_a_value_unless_it_may_be_empty():
    with pytest.raises(DemoError, match="^--sizes needs at least one value$"):
        Demo(sizes=[])

    @dataclass
    class Optional:
        levels: list[int] = option([1], "levels (none: skip them)", min=1, may_be_empty=True)

        def __post_init__(self):
            check_options(self, DemoError)

    assert Optional(levels=[]).levels == []


def test_entry_point_ends_a_user_error_with_one_line_and_lets_a_bug_keep_its_traceback(capsys):
    @entry_point
    def main(argv=None):
        if argv == ["bug"]:
            raise KeyError("bug")
        if argv == ["ctrl-c"]:
            raise KeyboardInterrupt
        raise DemoError(f"--flag {argv[0]} is wrong; give --flag 1")

    with pytest.raises(SystemExit) as exit_info:
        main(["x"])
    assert exit_info.value.code == "error: --flag x is wrong; give --flag 1"
    with pytest.raises(KeyError):
        main(["bug"])
    with pytest.raises(SystemExit) as exit_info:  # no message of its own: the signal and the status
        main(["ctrl-c"])
    assert exit_info.value.code == 130 and capsys.readouterr().err == "\nstopped by SIGINT; exit status 130\n"


def test_entry_point_with_a_message_ends_ctrl_c_with_it_and_exit_status_130(capsys):
    @entry_point(interrupted="while starting; nothing was written")
    def main(argv=None):
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 130
    assert capsys.readouterr().err == "\nstopped by SIGINT while starting; nothing was written; exit status 130\n"


def test_entry_point_ends_a_sigterm_with_what_the_stopped_code_said_and_128_plus_its_number(capsys):
    @entry_point(interrupted="while starting; nothing was written")
    def main(argv=None):
        with leaving("during round 2; round 1 is on disk"):
            raise Stopped(signal.SIGTERM)

    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 143
    assert capsys.readouterr().err == "stopped by SIGTERM during round 2; round 1 is on disk; exit status 143\n"


def test_entry_point_takes_sigint_and_sigterm_only_while_the_command_runs():
    """The handlers are the command's while it runs (SIG_IGN, as `cmd &` leaves SIGINT, included) and the
    previous ones afterwards; run in a process of its own, since it changes them."""
    script = """
import os, signal
from runtime.cli import entry_point
signal.signal(signal.SIGINT, signal.SIG_IGN)
@entry_point
def main(argv=None):
    os.kill(os.getpid(), signal.SIGINT)
    signal.pause()  # never reached: the signal stops the command
main([])
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 130 and result.stderr == "\nstopped by SIGINT; exit status 130\n", result.stderr
    after = "from runtime.cli import entry_point; import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); " \
            "entry_point(lambda argv: None)([]); assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN"
    assert subprocess.run([sys.executable, "-c", after], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=60).returncode == 0


def test_every_command_main_is_wrapped_by_entry_point():
    """A module run as a command (`if __name__ == "__main__"`) with a `main` decorates it with `entry_point`, so
    every command ends a user's mistake the same way."""
    commands = [path for path in python_files() if '__name__ == "__main__"' in path.read_text()]
    unwrapped = []
    for path in commands:
        for node in parsed(path).body:
            if isinstance(node, ast.FunctionDef) and node.name == "main":
                names = {ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list}
                if "entry_point" not in names:
                    unwrapped.append(str(path.relative_to(ROOT)))
    assert len(commands) > 15 and unwrapped == []
