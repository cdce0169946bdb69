"""The commands README.md and docs/ show, checked against the tools' own parsers, and the option tables docs/ shows,
written from those parsers (tests/test_docs.py holds both to the code).

    python -m tests.docs_commands          # rewrite docs/options/*.md after a flag changes

A command is a line in a fenced block that starts (after a `$ ` prompt and `NAME=value` settings) with `python`,
`torchrun` or `make`.  Its script or module must exist and its flags must parse as the tool parses them (a
`--config` file included); `make` must name a target of the Makefile.  A command is parsed, never run, by calling
the tool's `main` with its arguments and stopping it where its config has been built.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from runtime import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
OPTIONS = DOCS / "options"
PYTHONS = ("python", "python3", ".venv/bin/python", ".peers/venv/bin/python")
LAUNCHERS = ("torchrun", ".venv/bin/torchrun")
# The tools whose every option docs/ shows as a table (docs/options/NAME.md), each as a user types it.
TABLES = {"train": "train.py", "sample": "sample.py", "prune": "prune/iterative.py", "quantize": "quantize/dynamic.py",
          "serve": "python -m serve", "perplexity": "bench/eval/perplexity.py", "export": "python -m storage.export",
          "leaderboard": "bench/leaderboard.py", "loadtest": "bench/eval/loadtest.py", "harness": "bench/eval/harness.py",
          "plot_runs": "python -m bench.eval.plot_runs", "fetch_tokenizer": "python -m data.fetch_tokenizer",
          "run_all": "bench/run_all.py", "report": "bench/report.py", "serve_demo": "python -m serve.demo"}


@dataclass
class Command:
    source: str  # where it is shown: FILE:LINE
    words: list[str]  # the command line, settings and prompt removed, comments and `&` dropped

    def __str__(self) -> str:
        return f"{self.source}: {shlex.join(self.words)}"


def fenced_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a fenced code block, backslash continuations joined."""
    lines, inside, pending, start = [], False, "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append((start, pending + line))
        pending = ""
    return lines


def commands_in(path: Path) -> list[Command]:
    found = []
    for number, line in fenced_lines(path):
        text = line.strip().removeprefix("$ ")
        try:
            words = shlex.split(text, comments=True)
        except ValueError:  # not a shell line (a quote left open in an output sample)
            continue
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
            words = words[1:]
        if words and words[-1] == "&":
            words = words[:-1]
        if words and (words[0] in PYTHONS + LAUNCHERS + ("make",)) and "|" not in words:
            shown = path.relative_to(ROOT) if ROOT in path.parents else path.name
            found.append(Command(f"{shown}:{number}", words))
    return found


def documented_commands() -> list[Command]:
    pages = [ROOT / "README.md"] + sorted(path for path in DOCS.rglob("*.md") if OPTIONS not in path.parents)
    return [command for page in pages for command in commands_in(page)]


class Parsed(Exception):
    """Raised where a tool's config has been built: the command parsed, nothing ran."""

    def __init__(self, parser: argparse.ArgumentParser | None):
        super().__init__()
        self.parser = parser


def tool_and_args(words: list[str]) -> tuple[str, list[str]]:
    """("train.py" or "-m serve", its arguments) of a python or torchrun command line (`python -m parallel.launch`
    takes torchrun's flags)."""
    if words[0] in LAUNCHERS or words[1:3] in (["-m", "torch.distributed.run"], ["-m", "parallel.launch"]):
        launcher_args = words[1:] if words[0] in LAUNCHERS else words[3:]
        with contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                launch = torch_run_parser().parse_args(launcher_args)
            except SystemExit:
                raise AssertionError(f"torchrun does not take it: {err.getvalue().strip().splitlines()[-1]}") from None
        return launch.training_script, launch.training_script_args
    if words[1] == "-m":
        return f"-m {words[2]}", words[3:]
    return words[1], words[2:]


def torch_run_parser() -> argparse.ArgumentParser:
    from torch.distributed.run import get_args_parser
    parser = get_args_parser()
    parser.allow_abbrev = False  # torchrun's own allows them, but a command shown in the docs spells its flags out
    return parser


def module_of(tool: str):
    """The module whose `main` runs `tool` ("train.py", "bench/eval/perplexity.py" or "-m serve")."""
    if tool.startswith("-m "):
        name = tool[3:]
        module = importlib.import_module(name)
        return importlib.import_module(f"{name}.__main__") if hasattr(module, "__path__") else module
    path = ROOT / tool
    if not path.is_file():
        raise AssertionError(f"no such script: {tool}")
    return importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))


def parse(tool: str, args: list[str], build_config: bool = True) -> argparse.ArgumentParser:
    """Parse `args` as `tool` does, building its config (so its checks and `--config` file apply; not with
    `build_config=False`) and running nothing; returns its parser.  A refusal raises AssertionError with the tool's
    own line."""
    module = module_of(tool)
    seen: list[argparse.ArgumentParser] = []
    real_parser, real_build, real_parse_args = cli._parser, cli.dataclass_from_args, argparse.ArgumentParser.parse_args

    def parser(*a, **k):
        seen.append(real_parser(*a, **k))
        return seen[-1]

    def build(cls, namespace):
        if build_config:
            real_build(cls, namespace)
        raise Parsed(seen[-1] if seen else None)

    def parse_args(self, *a, **k):
        namespace = real_parse_args(self, *a, **k)
        if not seen or seen[-1] is not self:  # a tool with a plain argparse parser
            raise Parsed(self)
        return namespace

    patches = [mock.patch.object(cli, "_parser", parser), mock.patch.object(cli, "dataclass_from_args", build),
               mock.patch.object(argparse.ArgumentParser, "parse_args", parse_args)]
    if hasattr(module, "dataclass_from_args"):
        patches.append(mock.patch.object(module, "dataclass_from_args", build))
    with contextlib.ExitStack() as stack, contextlib.redirect_stdout(io.StringIO()):
        for patch in patches:
            stack.enter_context(patch)
        try:
            module.main(args)
        except Parsed as parsed:
            return parsed.parser
        except SystemExit as e:
            raise AssertionError(f"{tool} refuses it: {e.code}") from None
    raise AssertionError(f"{tool}'s main returned without parsing a command line")


def check(command: Command) -> None:
    """AssertionError unless `command` names an existing tool (or make target) and its flags parse."""
    words = command.words
    if words[0] == "make":
        targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
        wanted = [word for word in words[1:] if not word.startswith("-") and "=" not in word]
        unknown = [word for word in wanted if word not in targets]
        assert not unknown, f"{command}: no such make target {unknown} (the Makefile has {sorted(targets)})"
        return
    try:
        tool, args = tool_and_args(words)
        if "--help" in args or "-h" in args:
            return  # tests/test_docs.py runs these
        if tool.startswith("-m ") and not (ROOT / tool[3:].split(".")[0]).exists():  # another project's module
            assert importlib.util.find_spec(tool[3:]) is not None, f"no such module: {tool[3:]}"
            missing = [arg for arg in args if arg.endswith(".py") and not (ROOT / arg).is_file()]
            assert not missing, f"no such file: {missing}"
            return
        parse(tool, args)
    except AssertionError as e:
        raise AssertionError(f"{command}: {e}") from None


def tool_parser(tool: str) -> argparse.ArgumentParser:
    """The parser of `tool` as TABLES names it ("train.py", "python -m serve")."""
    words = tool.split()
    return parse(tool_and_args(words if words[0] == "python" else ["python", *words])[0], [], build_config=False)


def options_table(tool: str) -> str:
    """The Markdown table of every option `tool` takes, as its --help states them."""
    parser = tool_parser(tool)
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        invocation = formatter._format_action_invocation(action)
        # a default under the checkout is shown relative to it: the table is the same in every clone
        text = " ".join((action.help or "").split()).replace(f"{ROOT}/", "")
        rows.append(f"| `{invocation}` | {text.replace('|', '&#124;').replace('<', '&lt;')} |")
    command = tool if tool.startswith("python ") else f"python {tool}"
    return (f"<!-- Written by `python -m tests.docs_commands` from `{command} --help`; tests/test_docs.py checks it. -->\n"
            f"`{command}` takes these options (`{command} --help` prints the same); each is also a key of a "
            f"`--config` file, spelt without its leading dashes.\n\n"
            "| option | what it sets |\n|---|---|\n" + "\n".join(rows) + "\n")


def write_tables() -> None:
    OPTIONS.mkdir(parents=True, exist_ok=True)
    for name, tool in TABLES.items():
        (OPTIONS / f"{name}.md").write_text(options_table(tool))
        print(f"wrote {(OPTIONS / f'{name}.md').relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(write_tables())
