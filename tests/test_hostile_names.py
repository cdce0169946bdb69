"""The model-name and listening-address surfaces of issue 42 (tests/hostile.py's property).

Every flag that takes a model (--checkpoint of every tool, --draft, train.py --init-from), given a name that is not
there -- a typo of an existing folder, a missing path, a bare owner/name the hub cache lacks, any string at all --
answers one `error:` line before any model loads, and one that looks local says "no such folder".  `python -m
serve` given any --host and a port that may be in use answers one line before the model loads, or gets as far as
loading it.  None of them changes the folders it was pointed near."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import sample
import serve.__main__ as serve_main
import train
from bench import leaderboard
from bench.eval import harness, perplexity
from prune import iterative
from quantize import dynamic
from serve import demo
from storage import export
from storage.hub import looks_local
from tests.conftest import save_small_artifact
from tests.hostile import attempt, examples, unchanged

# The folders under the working directory that the drawn names are typos of.
EXISTING = ("out/mine-int8", "out/train")
# Every module that loads a model for a tool, by the name it imported load_model under.
LOADERS = ("sample", "serve.app", "prune.iterative", "quantize.dynamic", "storage.export", "bench.eval.scorecard",
           "bench.eval.perplexity", "bench.eval.harness", "training.checkpoint.checkpointer")


def typo(draw, name: str) -> str:
    """`name` with one character deleted, doubled or replaced: what a hand types by mistake."""
    at = draw(st.integers(0, len(name) - 1))
    edit = draw(st.sampled_from(["delete", "double", "replace"]))
    if edit == "delete":
        return name[:at] + name[at + 1:]
    if edit == "double":
        return name[:at] + name[at] + name[at:]
    return name[:at] + draw(st.characters(codec="utf-8", exclude_characters="/")) + name[at + 1:]


@st.composite
def typos(draw) -> str:
    return typo(draw, draw(st.sampled_from(EXISTING)))


MISSING_PATHS = st.builds(lambda start, rest: start + rest, st.sampled_from(["./", "/", "~/", "../", "out/", "a\\",
                                                                              "out/train/", "nope/deeper/"]),
                          st.text(st.characters(codec="utf-8"), max_size=12))
BARE_HUB_NAMES = st.from_regex(r"[A-Za-z0-9][\w.-]{0,10}/[\w.-]{1,10}", fullmatch=True) | st.sampled_from(
    ["gpt2", "gpt2-xl"])
# Any string argv can carry: undecodable bytes arrive as lone surrogates; very long names overflow the system's.
ANY_STRING = st.text(st.characters(), max_size=30) | st.sampled_from(["a" * 300, "x/" * 200, "\x00", "\n", " "])
NAMES = typos() | MISSING_PATHS | BARE_HUB_NAMES | ANY_STRING


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A working directory as a user's is: out/ with two artifacts."""
    root = tmp_path_factory.mktemp("names")
    for name in EXISTING:
        save_small_artifact(root / name)
    return root


@pytest.fixture
def offline_here(workspace, monkeypatch) -> Path:
    """The workspace as the working directory, an empty hub cache that is never contacted, and no model loader
    that works: reaching one is the failure these properties look for."""
    monkeypatch.chdir(workspace)
    monkeypatch.setenv("HF_HUB_CACHE", str(workspace.parent / "empty-hub-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def load_model(*args, **kwargs):
        raise AssertionError(f"a model loaded: {args[0]}")
    for module in LOADERS:
        monkeypatch.setattr(f"{module}.load_model", load_model)
    return workspace


def model_flags(good: str) -> dict:
    """Each flag that takes a model, as a tool's `main` with that flag given `name` (`=`: a name that starts with
    a dash is still the flag's value); the other settings valid, and `good` where a tool needs a second model."""
    return {
        "sample.py --checkpoint": lambda name: sample.main([f"--checkpoint={name}", "--prompt", "x"]),
        "sample.py --draft": lambda name: sample.main(["--checkpoint", good, f"--draft={name}", "--prompt", "x"]),
        "serve --checkpoint": lambda name: serve_main.main([f"--checkpoint={name}", "--port", "0"]),
        "serve --draft": lambda name: serve_main.main(["--checkpoint", good, f"--draft={name}", "--port", "0"]),
        "serve.demo --checkpoint": lambda name: demo.main([f"--checkpoint={name}"]),
        "prune --checkpoint": lambda name: iterative.main([f"--checkpoint={name}", "--target", "0.5", "--out-dir",
                                                          "pruned"]),
        "quantize --checkpoint": lambda name: dynamic.main([f"--checkpoint={name}", "--out-dir", "int8"]),
        "export --checkpoint": lambda name: export.main([f"--checkpoint={name}", "--out", "exported"]),
        "leaderboard --checkpoint": lambda name: leaderboard.main([f"--checkpoint={name}", "--dataset", "builtin"]),
        "perplexity --checkpoint": lambda name: perplexity.main([f"--checkpoint={name}"]),
        "harness --checkpoint": lambda name: harness.main([f"--checkpoint={name}"]),
        "train.py --init-from": lambda name: train.main([f"--init-from={name}", "--out-dir", "run"]),
    }


def refusal(surface: str, run) -> str:
    """`attempt` on a tool's `main`, which must refuse: its `error:` line."""
    said = []

    def action():
        try:
            run()
        except SystemExit as e:
            said.append(e.code)
            raise
    assert attempt(surface, action) == "refused", f"{surface}: worked"
    return said[0]


@pytest.mark.parametrize("surface", list(model_flags("")))
@examples(6)
@given(name=NAMES)
@example(name="out/trian").via("a typo of out/train")
@example(name="out/mine-int9").via("issue 42's --draft")
@example(name="owner/name").via("a bare hub id, not in the cache")
def test_every_model_flag_refuses_a_name_that_is_not_there_before_a_model_loads(offline_here, surface, name):
    if not name or os.path.lexists(name):
        return  # an existing folder is a model to load, and an empty name means the default checkpoint
    run = model_flags(str(offline_here / EXISTING[0]))[surface]
    with unchanged(surface, offline_here / "out"):
        message = refusal(surface, lambda: run(name))
    assert "a model loaded" not in message
    if looks_local(name):
        assert ": no such folder: " in message, message
    assert not any((offline_here / made).exists() for made in ("pruned", "int8", "exported", "run"))


def test_a_typo_of_a_folder_names_the_folder(offline_here):
    """Issue 42: `--draft out/mine-int9` suggested snapshot_download('out/mine-int9') after the model loaded."""
    with pytest.raises(SystemExit) as exit_info:
        sample.main(["--checkpoint", "out/train", "--draft", "out/mine-int9", "--prompt", "x"])
    assert exit_info.value.code == ("error: --draft: no such folder: out/mine-int9; did you mean out/mine-int8? (a hub "
                                    "name is gpt2, gpt2-medium, gpt2-large, gpt2-xl or a bare owner/name)")


@pytest.fixture
def held_port():
    """A port some other server is listening on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


def test_a_port_in_use_is_one_line_before_the_model_loads(offline_here, held_port):
    with pytest.raises(SystemExit) as exit_info:
        serve_main.main(["--checkpoint", "out/train", "--port", str(held_port)])
    assert exit_info.value.code == (f"error: port {held_port} on 127.0.0.1 is in use; pass --port with a free one "
                                    f"(--port 0 picks any), or stop the server holding it")


HOSTS = st.sampled_from(["127.0.0.1", "localhost", "::1", "0.0.0.0", "", "192.0.2.1", "no.such.host.invalid",
                         "999.1.1.1", "[::1]", "a" * 300]) | st.text(st.characters(), max_size=20)


@examples(20)
@given(host=HOSTS, in_use=st.booleans())
def test_any_listening_address_is_one_line_or_a_start(offline_here, held_port, monkeypatch, host, in_use):
    def started(config):
        raise serve_main.ServeConfigError("started")
    monkeypatch.setattr(serve_main, "create_app", started)
    message = refusal("serve --host/--port", lambda: serve_main.main(
        [f"--host={host}", "--port", str(held_port if in_use else 0), "--checkpoint", "out/train"]))
    if message != "error: started":
        assert message.startswith(("error: port ", "error: cannot listen on ", "error: --host ")), message
