"""README.md and docs/ against the code: every command they show names a flag its tool takes (and a file that is
there), the short ones run, the option tables are the parsers' own, and the README stays a front page whose
figures live in bench/REPORT.md."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from tests.docs_commands import (OPTIONS, ROOT, TABLES, Command, check, commands_in, documented_commands,
                                 options_table, tool_parser)

COMMANDS = documented_commands()
# A measured figure as prose states one: a ratio (1.14x), a rate or a duration with its unit, a share of a machine.
FIGURE = re.compile(r"\b\d+(\.\d+)?x\b|\b\d[\d,.]*\s?(ms|GB/s|MB/s|tokens/s|GiB|min \d+ s)\b")


def test_the_pages_show_commands_of_every_kind():
    kinds = {command.words[0].split("/")[-1] for command in COMMANDS}
    assert {"python", "torchrun", "make"} <= kinds and len(COMMANDS) > 60


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_command_shown_parses_as_its_tool_parses_it(command):
    check(command)


@pytest.mark.parametrize("words, message", [
    (["python", "train.py", "--max-step", "3"], "unknown flag --max-step, did you mean --max-steps?"),
    (["torchrun", "--nproc_per_node=2", "train.py", "--parallel", "fsdq"], "invalid choice: 'fsdq'"),
    (["python", "train.py", "--config", "configs/nothing.toml"], "configs/nothing.toml: no such file"),
    (["python", "prune/iterative.py"], "--target is required"),
    (["python", "bench/nothing.py"], "no such script: bench/nothing.py"),
    (["python", "-m", "pytest", "tests/test_nothing.py"], "no such file"),
    (["make", "smokey"], "no such make target ['smokey']"),
    (["torchrun", "--nproc-per-nod=2", "train.py"], "torchrun does not take it"),
])
def test_a_command_that_does_not_parse_fails_with_the_tools_own_line(words, message):
    with pytest.raises(AssertionError) as error:
        check(Command("page.md:1", words))
    assert message in str(error.value)


def test_commands_are_found_in_fenced_blocks_only_with_prompts_settings_and_continuations(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("python train.py --outside\n```bash\n$ OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 \\\n"
                    "    train.py --parallel ddp   # two ranks\npip install x\npython -m serve &\n```\n")
    assert [command.words for command in commands_in(page)] == [
        ["torchrun", "--nproc_per_node=2", "train.py", "--parallel", "ddp"], ["python", "-m", "serve"]]


HELP_COMMANDS = [command for command in COMMANDS if "--help" in command.words]


@pytest.mark.parametrize("command", HELP_COMMANDS, ids=str)
def test_the_help_commands_shown_run(command):
    job = subprocess.run([sys.executable, *command.words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert job.returncode == 0 and job.stdout.startswith("usage:"), job.stderr[-2000:]


@pytest.mark.parametrize("name", list(TABLES))
def test_each_option_table_is_the_one_its_parser_writes(name):
    """--help and docs/ say the same: `python -m tests.docs_commands` rewrites the tables after a flag changes."""
    assert (OPTIONS / f"{name}.md").read_text() == options_table(TABLES[name]), \
        f"docs/options/{name}.md differs from {TABLES[name]}'s parser: run python -m tests.docs_commands"


def test_every_option_table_is_shown_on_a_page():
    pages = "".join(path.read_text() for path in (ROOT / "docs").glob("*.md"))
    assert [name for name in TABLES if f'--8<-- "options/{name}.md"' not in pages] == []


def test_the_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "make demo" in text and "make test" in text and "(bench/REPORT.md)" in text


@pytest.mark.parametrize("page", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))])
def test_measured_figures_are_left_to_the_benchmark_report(page):
    figures = [line for line in (ROOT / page).read_text().splitlines() if FIGURE.search(line)]
    assert figures == [], f"{page} quotes figures; put them in bench/REPORT.md (bench/by_hand.md) and link it"


@pytest.mark.parametrize("name", list(TABLES))
def test_help_holds_no_stray_escape_and_no_measured_figure(name):
    """A reader of `--help` (and of docs/options/, written from the same texts) sees no argparse escape (`%%`, which
    the option tables would show raw) and no measured figure, which ages there unseen: a help links the report."""
    parser = tool_parser(TABLES[name])
    shown = parser.format_help()
    raw = [action.help or "" for action in parser._actions]
    assert "%%" not in shown and not [text for text in raw if "%%" in text or "%(" in text], \
        f"{TABLES[name]}: a help text escapes '%'; write 'per cent' or link the report"
    figures = [line.strip() for line in shown.splitlines() if FIGURE.search(line)]
    assert figures == [], f"{TABLES[name]} --help quotes figures; link bench/REPORT.md instead"


def makefile_commands(target: str) -> list[Command]:
    """The tool commands of a Makefile target's recipe, as a user would type them ($(PY) is python)."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", text, re.M).group(1)
    variables = dict(re.findall(r"^(\w+) :?= (.*)$", text, re.M))
    commands = []
    for line in recipe.splitlines():
        line = re.sub(r"\$\((\w+)\)", lambda m: {"PY": "python"}.get(m.group(1), variables.get(m.group(1), "")), line)
        words = shlex.split(line)
        while words and "=" in words[0]:
            words = words[1:]
        if words and words[0] == "python":
            commands.append(Command(f"Makefile ({target})", words))
    return commands


@pytest.mark.parametrize("command", makefile_commands("demo"), ids=str)
def test_make_demo_runs_commands_its_tools_parse(command):
    check(command)
