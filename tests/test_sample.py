import subprocess
import sys

import pytest


def run_sample(*args, stdin=None):
    return subprocess.run([sys.executable, "sample.py", *args], capture_output=True, text=True, input=stdin,
                          timeout=120)


def test_sample_prints_text_and_speed(small_artifact):
    result = run_sample("--checkpoint", small_artifact, "--prompt", "Hello", "--num-samples", "2",
                        "--max-new-tokens", "8", "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("--- sample") == 2 and result.stdout.count("Hello") == 2
    assert "tokens/s" in result.stderr and "loaded float model" in result.stderr


def test_prompt_from_stdin_and_seed_reproducibility(small_artifact):
    a = run_sample("--checkpoint", small_artifact, "--max-new-tokens", "8", "--seed", "5", stdin="Once upon")
    b = run_sample("--checkpoint", small_artifact, "--max-new-tokens", "8", "--seed", "5", stdin="Once upon")
    assert a.returncode == 0 and a.stdout == b.stdout and a.stdout.count("Once upon") == 1


@pytest.mark.parametrize("args, message", [
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--checkpoint", "/no/such/dir"], "does not exist"),
    (["--max-new-tokens", "1000"], "exceeds the model's context of 64"),
])
def test_bad_input_is_explained(small_artifact, args, message):
    base = [] if "--checkpoint" in args else ["--checkpoint", small_artifact]
    result = run_sample(*base, *args, "--prompt", "x")
    assert result.returncode != 0 and message in result.stderr
