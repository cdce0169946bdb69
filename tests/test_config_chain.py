"""configs/gpt2-medium-wikitext103/ as a user runs it: train (FSDP, and in turn TP), prune, quantize, score and
serve, each from its shipped file, with the sizes overridden exactly as docs/configs.md shows them ("The same chain
at test size"), offline.  The files' own folders are used, in a folder of the test's own (a symbolic link to each of
the repository's entries, so `train.py` and `configs/...` are found as the page writes them), so a training file that
writes where the next file does not read fails here.

After the TP training the chain stops at prune, which reads the training's folder (prune, quantize and the
scorecard name the same one: the page test holds that): the rest reads the same files whichever file trained, and
run again after the TP training they would add most of a chain's CPU time (the scorecard alone is seven processes:
its own, and two training runs of a launcher and two ranks each) to `make test`, which it shares with every test."""
from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from serve.launch import StartBudget

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs/configs.md"
MARKER = "The same chain at test size"
FILES = "configs/gpt2-medium-wikitext103"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
# The server's start-up, in seconds of its own CPU time (serve/launch.py's bound), which a busy host does not stretch.
READY_CPU_S = 180


def chain_commands() -> list[list[str]]:
    """The command lines of the first fenced block after MARKER in docs/configs.md, continuations joined."""
    text = PAGE.read_text()
    block = text[text.index(MARKER):].split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def checkout_view(folder: Path) -> Path:
    """A folder that looks like the checkout to a command run in it (every entry a link), with its own out/."""
    folder.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in ("out", ".git"):
            (folder / entry.name).symlink_to(entry)
    return folder


def run(words: list[str], cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, *words[1:]] if words[0] == "python" else words
    job = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, f"{shlex.join(words)}\n{job.stderr[-3000:]}"
    return job


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_and_ask(words: list[str], cwd: Path) -> dict:
    """Start the server as shown (on a free port: the shipped 8000 may be taken), ask it one completion, stop it."""
    port = free_port()
    server = subprocess.Popen([sys.executable, *words[1:], "--port", str(port)], cwd=cwd, env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        budget = StartBudget(server.pid, READY_CPU_S)
        while True:
            assert server.poll() is None, server.stderr.read()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                assert not (spent := budget.spent()), f"the server did not get ready {spent}"
                time.sleep(0.5)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", method="POST", headers={"content-type": "application/json"},
            data=json.dumps({"model": "gpt2-medium-wikitext103", "prompt": "The history of", "max_tokens": 4}).encode())
        with urllib.request.urlopen(request, timeout=120) as answer:
            return json.load(answer)
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=120)


def test_the_page_shows_the_whole_chain_from_the_shipped_files():
    commands = chain_commands()
    assert [words[words.index("--config") + 1] for words in commands] == [
        f"{FILES}/train-fsdp.toml", f"{FILES}/prune.toml", f"{FILES}/quantize.toml", f"{FILES}/scorecard.toml",
        f"{FILES}/serve.toml"]
    read = {Path(words[words.index("--config") + 1]).stem: tomllib.loads((ROOT / words[words.index("--config") + 1])
                                                                  .read_text()) for words in commands}
    assert read["prune"]["checkpoint"] == read["quantize"]["checkpoint"] == read["scorecard"]["checkpoint"] == \
        read["train-fsdp"]["out-dir"] == tomllib.loads((ROOT / FILES / "train-tp.toml").read_text())["out-dir"]
    for words in commands:  # sizes and the offline sources only: no folder of the files is replaced
        assert not {"--out-dir", "--checkpoint", "--out", "--init-from"} & set(words) or \
            words[words.index("--init-from") + 1] == "none"


@pytest.mark.parametrize("train_file", ["train-fsdp.toml", "train-tp.toml"])
def test_each_training_file_chains_into_prune_and_fsdps_into_quantize_score_and_serve(train_file, tmp_path):
    checkout = checkout_view(tmp_path / "checkout")
    train, prune, quantize, scorecard, serve = chain_commands()
    train = [word.replace("train-fsdp.toml", train_file) for word in train]
    run(train, checkout)
    trained = checkout / "out/gpt2-medium-wikitext103"
    recorded = json.loads((trained / "training_state/state.json").read_text())["train_config"]
    assert (recorded["parallel"], recorded["model"], recorded["init_from"], recorded["lr"]) == (
        train_file[6:-5], "tiny", None, 3e-5)  # the file's settings where the page does not override them
    run(prune, checkout)
    assert json.loads((checkout / "out/gpt2-medium-wikitext103-prune/config.json").read_text())["artifact"] == "pruned"
    if train_file == "train-tp.toml":
        return  # quantize and the scorecard read the folder prune read; serve reads quantize's: once is enough
    run(quantize, checkout)
    assert json.loads((checkout / "out/gpt2-medium-wikitext103-int8/config.json").read_text())["artifact"] == "int8"
    run(scorecard, checkout)
    score = json.loads((checkout / "out/gpt2-medium-wikitext103-scorecard.json").read_text())
    assert score["complete"] and {"loss", "training_throughput_4", "training_throughput_12"} <= score.keys()
    answer = serve_and_ask(serve, checkout)
    assert answer["model"] == "gpt2-medium-wikitext103" and answer["choices"][0]["text"]
