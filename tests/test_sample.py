import contextlib
import io
import json
import subprocess
import sys
from unittest import mock

import pytest

from data.tokenizer import decode


def run_sample(*args, stdin=None) -> subprocess.CompletedProcess:
    """sample.py's command line, run in this process (a new one would spend ~4 s importing torch): its
    output, and the exit status and `error:` line its `sys.exit` would give."""
    import sample
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(sys, "stdin", io.TextIOWrapper(io.BytesIO((stdin or "").encode()))):
        try:
            sample.main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
            if isinstance(e.code, str):
                print(e.code, file=err)
    return subprocess.CompletedProcess(["sample.py", *args], code, out.getvalue(), err.getvalue())


def test_sample_prints_text_and_speed(small_artifact):
    result = run_sample("--checkpoint", small_artifact, "--prompt", "Hello", "--num-samples", "2",
                        "--max-new-tokens", "8", "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("--- sample") == 2 and result.stdout.count("Hello") == 2
    assert "tokens/s" in result.stderr and "loaded float model" in result.stderr


@pytest.mark.parametrize("before_first", [0.0, 0.2])
def test_the_speed_line_leaves_the_prompt_and_the_set_up_out_of_the_decode_rate(before_first):
    import sample
    from decode.generate import CallTiming
    # 32 columns of 2 rows: the first 50 ms after the start (plus any set-up before it), then 31 steps of 4 ms
    # with 300 ms of set-up among them.
    first = 0.05 + before_first
    times = [10 + first] + [10 + first + 0.3 + 0.004 * i for i in range(1, 32)]
    speed = sample.CallSpeed.of(2, 10.0, times, CallTiming(setup_s=0.3 + before_first,
                                                            setup_before_first_token_s=before_first))
    assert speed.tokens_per_s == pytest.approx(2 * 31 / (31 * 0.004))
    line = speed.line()
    assert line.startswith(f"64 new tokens (batch 2): the first after {first * 1e3:.0f} ms (the prompt")
    assert ("+ 200 ms of set-up)" in line) == bool(before_first)
    assert line.endswith(f"then 500.0 tokens/s over the 31 steps after it, not counting "
                         f"{(0.3 + before_first) * 1e3:.0f} ms of one-time set-up (tracing decode steps)")


def test_prompt_from_stdin_and_seed_reproducibility(small_artifact):
    a = run_sample("--checkpoint", small_artifact, "--max-new-tokens", "8", "--seed", "5", stdin="Once upon")
    b = run_sample("--checkpoint", small_artifact, "--max-new-tokens", "8", "--seed", "5", stdin="Once upon")
    assert a.returncode == 0 and a.stdout == b.stdout and a.stdout.count("Once upon") == 1


@pytest.mark.parametrize("args, message", [
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--checkpoint", "/no/such/dir"], "--checkpoint: no such folder: /no/such/dir; "),
    (["--max-new-tokens", "1000"], "exceeds the model's context of 64"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0, got nan"),
    (["--prompt-file", "."], "--prompt-file . is not a file"),
])
def test_bad_input_is_explained(small_artifact, args, message):
    base = [] if "--checkpoint" in args else ["--checkpoint", small_artifact]
    prompt = [] if "--prompt-file" in args else ["--prompt", "x"]
    result = run_sample(*base, *args, *prompt)
    assert result.returncode != 0 and message in result.stderr


def test_prompts_file_runs_every_good_line_in_batches_and_reports_bad_ones(small_artifact, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join([
        json.dumps({"prompt": "Hello there", "max_new_tokens": 4, "temperature": 0}),
        "{not json",
        json.dumps({"prompt": "Hello world", "max_new_tokens": 4, "temperature": 0}),  # same length: one batch
        json.dumps({"prompt": "A", "temperature": 1e-45, "max_new_tokens": 3}),  # below the floor: greedy
        json.dumps({"text": "no prompt key"}),
        json.dumps({"prompt": "x", "max_new_tokens": 1000}),  # too long for the context: this line alone fails
    ]) + "\n")
    out = tmp_path / "out.jsonl"
    result = run_sample("--checkpoint", small_artifact, "--prompts-file", str(prompts), "--output", str(out),
                        "--batch-size", "4")
    assert result.returncode == 0, result.stderr
    assert f"{prompts}:2: skipped" in result.stderr and f"{prompts}:5: skipped" in result.stderr
    rows = {r["line"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    assert "error" in rows[2] and "error" in rows[5] and "exceeds the model's context" in rows[6]["error"]
    for line in (1, 3, 4):
        assert rows[line]["finish_reason"] in ("stop", "length") and rows[line]["latency_s"] > 0
        assert rows[line]["tokens"] == rows[line]["tokens"][:4] and rows[line]["text"] == decode(rows[line]["tokens"])
    # Greedy in a batch equals greedy alone.
    alone = run_sample("--checkpoint", small_artifact, "--prompt", "Hello world", "--max-new-tokens", "4",
                       "--temperature", "0")
    assert decode(rows[3]["tokens"]) in alone.stdout


def test_prompts_file_lines_of_the_wrong_type_or_encoding_fail_alone(small_artifact, tmp_path, capsys):
    import sample
    prompts = tmp_path / "prompts.jsonl"
    good = json.dumps({"prompt": "Hello", "max_new_tokens": 2, "temperature": 0, "top_k": None})
    bad = ['{"prompt": "a", "seed": "7"}', '{"prompt": "a", "max_new_tokens": 2.5}', '{"prompt": "a", "top_k": 1.5}',
           '{"prompt": "a", "seed": NaN}', '{"prompt": "a", "seed": 1e30}', '{"prompt": "a", "seed": ' + "9" * 30 + "}",
           '{"prompt": "a", "temperature": true}',
           # past Python's parsers: a 5,000-digit seed, a prompt nested 100,000 deep, a 4,301-digit bias key
           '{"prompt": "a", "seed": ' + "5" * 5000 + "}", '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}",
           json.dumps({"prompt": "a", "logit_bias": {"1" * 4301: 1}})]
    prompts.write_bytes("\n".join([good, *bad]).encode() + b'\n{"prompt": "caf\xe9"}\n' + good.encode() + b"\n")
    out = tmp_path / "out.jsonl"
    sample.main(["--checkpoint", small_artifact, "--prompts-file", str(prompts), "--output", str(out)])
    rows = {r["line"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == list(range(1, 14))
    assert rows[1]["tokens"] == rows[13]["tokens"] and len(rows[1]["tokens"]) <= 2
    expected = {2: "seed must be an integer or null, got \"7\"", 3: "max_new_tokens must be an integer, got 2.5",
                4: "top_k must be an integer or null, got 1.5", 5: "seed must be an integer or null, got NaN",
                6: "seed must be an integer or null, got 1e+30", 7: "seed must be in [-2**63, 2**63)",
                8: "temperature must be a number, got true",
                9: "not JSON: holds an integer of more than 4300 digits",
                10: "not JSON: nested deeper than the parser can follow",
                11: "logit_bias: token id 11111111111111111111... (4301 characters) is outside the vocabulary",
                12: "not UTF-8: byte 0xe9 at column 16"}
    stderr = capsys.readouterr().err
    for line, message in expected.items():
        assert message in rows[line]["error"] and f"{prompts}:{line}: skipped: {message}" in stderr


def test_output_that_cannot_be_written_fails_before_the_model_loads(small_artifact, tmp_path, monkeypatch):
    import sample
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Hello"}\n')
    monkeypatch.setattr(sample, "load_model", lambda *a: pytest.fail("loaded the model before checking --output"))
    with pytest.raises(SystemExit, match=f"error: --output {tmp_path} cannot be written \\(Is a directory\\)"):
        sample.main(["--checkpoint", small_artifact, "--prompts-file", str(prompts), "--output", str(tmp_path)])


def test_results_already_generated_survive_a_crash(small_artifact, tmp_path, monkeypatch):
    import sample
    prompts = tmp_path / "prompts.jsonl"
    # Two prompt lengths: two calls to generate; the second one crashes.
    prompts.write_text('{"prompt": "Hello", "max_new_tokens": 2}\n{"prompt": 1}\n{"prompt": "Hello there friend"}\n')
    real_generate, calls = sample.generate, []

    def generate(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("a crash mid-run")
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(sample, "generate", generate)
    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError, match="mid-run"):
        sample.main(["--checkpoint", small_artifact, "--prompts-file", str(prompts), "--output", str(out)])
    rows = {r["line"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == [1, 2] and "error" in rows[2] and len(rows[1]["tokens"]) <= 2


def test_a_prompt_file_that_is_not_utf8_is_one_error_line(small_artifact, tmp_path):
    import sample
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes(b"Hello\nw\xff")
    with pytest.raises(SystemExit, match=f"error: {prompt} is not UTF-8: byte 0xff at offset 7 \\(line 2\\)"):
        sample.main(["--checkpoint", small_artifact, "--prompt-file", str(prompt)])


def test_logit_bias_and_penalties_take_the_servers_form(small_artifact, tmp_path):
    """sample.py's door to decode/request_sampling.py: --logit-bias is OpenAI's JSON object, and a prompts file's
    line may carry its own."""
    forced = run_sample("--checkpoint", small_artifact, "--prompt", "Hello", "--max-new-tokens", "4",
                        "--logit-bias", '{"262": 100}', "--temperature", "1")
    assert forced.returncode == 0, forced.stderr
    assert "Hello the the the the" in forced.stdout
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hi", "max_new_tokens": 3, "logit_bias": {"13": 100}}) + "\n" +
                       json.dumps({"prompt": "Hi", "max_new_tokens": 3, "logit_bias": {"x": 1}}) + "\n" +
                       json.dumps({"prompt": "Hi", "max_new_tokens": 3, "presence_penalty": 9}) + "\n")
    out = tmp_path / "out.jsonl"
    assert run_sample("--checkpoint", small_artifact, "--prompts-file", str(prompts), "--output", str(out)).returncode == 0
    rows = {r["line"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows[1]["tokens"] == [13] * 3
    assert "logit_bias: key 'x' is not a token id" in rows[2]["error"]
    assert "presence_penalty must be in [-2, 2], got 9" in rows[3]["error"]


@pytest.mark.parametrize("args, message", [
    (["--logit-bias", "{x"], "--logit-bias is not JSON"),
    (["--logit-bias", "[1]"], "--logit-bias must be an object of token ids and biases"),
    (["--logit-bias", '{"50257": 1}'], "--logit-bias: token id 50257 is outside the vocabulary"),
    (["--logit-bias", '{"1": -101}'], "the bias of token 1 must be in [-100, 100], got -101"),
    (["--logit-bias", '{"' + "1" * 4301 + '": 1}'], "--logit-bias: token id 11111111111111111111... (4301 characters) "
                                                    "is outside the vocabulary"),
    (["--logit-bias", "[" * 50_000 + "]" * 50_000], "--logit-bias is not JSON (nested deeper than the parser can "
                                                    "follow"),
    (["--presence-penalty", "2.5"], "--presence-penalty must be in [-2, 2], got 2.5"),
    (["--frequency-penalty", "nan"], "--frequency-penalty must be in [-2, 2], got nan"),
])
def test_bad_bias_and_penalty_flags_are_one_line_naming_the_flag(small_artifact, args, message):
    result = run_sample("--checkpoint", small_artifact, "--prompt", "x", *args)
    assert result.returncode != 0 and message in result.stderr and result.stderr.count("\n") == 1, result.stderr
