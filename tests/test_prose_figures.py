"""Figures live in result files, not in the product's prose.

A measured figure in a comment or docstring was true once, on one machine, and goes stale with the next
measurement; the code says what it does and why, and names the experiment that measures it (`python -m
bench.experiments generate_speed`, bench/results/generate_speed.json).  The rule this test holds the product's
prose to (model/, parallel/, serve/, prune/, quantize/, data/, storage/, training/, runtime/, train.py and
sample.py; not bench/, tests/ or the README, whose business is measurements):

- A figure is a number followed by a unit: a ratio (`3.7x`), a share (`80%`), a time (`0.2 ms`, `2.5 s`, `45 min`,
  `6 h`), a size (`412 MB`, `4 GiB`) or a rate (`12 GB/s`, `22.0 tokens/s`).  A one-letter unit (`s`, `h`) counts
  after a space only, so that `413s` (status codes) is not a time; a number joined to a word (`1x1024`, a shape)
  is no ratio.
- It counts in comments and docstrings, including a setting restated in prose (the code holds the value once, by
  its constant's name) and an illustration (`a 5 GB file`: write `a large file`).
- It does not count in string values: help texts and messages are what a user reads, where `--timeout-s`'s
  `(default: 10)` is a setting, not a measurement.  Nor inside backticks or double quotes in prose: that is an
  example of what a tool prints or of a command line (`"train.txt (78 KB)"`), not a claim about speed or size.

At most three places may keep a figure, each in ALLOWED with the reason it is not a measurement that goes stale.
Comments and docstrings are read with `tokenize`, only in the files whose text holds a figure at all, which keeps
the test quick.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize

from tests.source_tree import ROOT, python_files

PRODUCT = ("model", "parallel", "serve", "prune", "quantize", "data", "storage", "training", "runtime", "train.py",
           "sample.py")
_UNIT = (r"(?:x|×|%|\s?(?:ns|µs|us|ms|sec|seconds?|min|minutes?|hours?|days?|[KMGT]i?B|[KMG]B/s|tokens/s|tok/s)"
         r"|\s(?:s|h))")
FIGURE = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*" + _UNIT + r"(?![\w/])")
# Prose quoting an example: backticks (which may span lines) or double quotes on one line.
QUOTED = re.compile(r"`[^`]*`|\"[^\"\n]*\"")
# (file, the figure as written): why it stays.  At most three.
ALLOWED: dict[tuple[str, str], str] = {}
STATEMENT_START = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, None}


def figures(text: str) -> list[tuple[int, str]]:
    """The figures in a piece of prose, its quoted examples left out, each with its line within the text."""
    unquoted = QUOTED.sub(lambda quoted: re.sub(r"[^\n]", " ", quoted.group()), text)
    return [(unquoted.count("\n", 0, m.start()), m.group()) for m in FIGURE.finditer(unquoted)]


def figures_only(text: str) -> list[str]:
    return [figure for _, figure in figures(text)]


def prose(source: str):
    """(line, text) of every comment and every string that is a statement of its own (a docstring)."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type != tokenize.NL]
    previous = None
    for i, token in enumerate(tokens):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
            continue
        following = tokens[i + 1].type if i + 1 < len(tokens) else None
        if token.type == tokenize.STRING and previous in STATEMENT_START and following in (tokenize.NEWLINE,
                                                                                           tokenize.COMMENT):
            yield token.start[0], ast.literal_eval(token.string)  # the text, without its quotes
        previous = token.type


def figures_in_prose() -> list[tuple[str, int, str]]:
    found = []
    for path in python_files(*PRODUCT):
        source = path.read_text()
        if not FIGURE.search(source):  # most files: no figure anywhere, not even in a help text
            continue
        for line, text in prose(source):
            found += [(str(path.relative_to(ROOT)), line + lines, figure) for lines, figure in figures(text)]
    return found


def test_what_counts_as_a_figure():
    assert figures_only("a probe ran at 3.7x eager steps, 3.7 ms a token") == ["3.7x", "3.7 ms"]
    assert figures_only("bf16 measured ~400x slower; 80% zeros; 0.7 s to import; 412 MB; 4 GiB; 51 GB/s; "
                   "22.0 tokens/s; 45 min; 6 h") == ["400x", "80%", "0.7 s", "412 MB", "4 GiB", "51 GB/s",
                                                     "22.0 tokens/s", "45 min", "6 h"]
    assert figures_only('it logs the 413s; a 1x1024 shape; GPT-2 124M; 8 x 256 tokens; 4 bytes each; 2 threads') == []
    assert figures_only('sizes, e.g. "train.txt (78 KB)"; output such as `notes.txt (152 KB)`') == []


def test_prose_reads_comments_and_docstrings_not_string_values():
    source = ('"""A module that takes 2 s."""\n'
              'x = "a help text: 10 s"  # a comment: 3 ms\n'
              'def f():\n'
              '    """Its docstring: 4x."""\n'
              '    return f"{x} 5 s"\n')
    assert [figure for _, text in prose(source) for figure in figures_only(text)] == ["2 s", "3 ms", "4x"]


def test_no_measured_figure_in_product_prose():
    assert len(ALLOWED) <= 3
    found = figures_in_prose()
    kept = [(path, figure) for path, _, figure in found if (path, figure) in ALLOWED]
    stale = [f"{path}:{line}: {figure}" for path, line, figure in found if (path, figure) not in ALLOWED]
    assert stale == [], "say what the code does and why, and name the experiment and result file that measure it"
    assert sorted(set(kept)) == sorted(ALLOWED), "an allowed figure is gone: take it out of ALLOWED"
