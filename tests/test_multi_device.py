"""bench/standalone/multi_device.py, the multi-GPU recipe's one command, runs end to end on 2 CPU ranks (gloo): a mode trains
the single device's model, and the scaling table is relative to that device."""
from __future__ import annotations

import json

import pytest

from bench.peers import host_rates
from bench.standalone import multi_device


def test_tensor_parallel_on_two_cpu_ranks_equals_one_device_and_scales_against_it(tmp_path, monkeypatch, capsys):
    # One mode, the hand-written one: each mode is its own torchrun job of the same code path here, and every
    # layout's equality with one device is tests/test_parallel.py's (two more jobs cost `make test` 40 s of CPU).
    monkeypatch.setattr(multi_device, "WORK", tmp_path / "work")
    # The host's rates are a separate measurement (1 GiB read, a minute on a busy host); its record is what counts.
    monkeypatch.setattr(host_rates, "measure_in_process", lambda threads: host_rates.HostRates(1.0, 1.0, threads, [0]))
    out = tmp_path / "multi_device.json"
    multi_device.main(["--ranks", "2", "--model", "tiny", "--device", "cpu", "--block-size", "16",
                                "--global-batch", "4", "--steps", "3", "--warmup-steps", "1", "--modes", "tp",
                       "--out", str(out)])
    result = json.loads(out.read_text())
    runs = {(r["mode"], r["ranks"]): r for r in result["runs"]}
    assert set(runs) == {("tp", 2)}
    reference = result["reference"]
    assert len(reference["losses"]) == 3
    for run in runs.values():
        assert run["equal"] and run["max_relative_loss_diff"] <= 1e-4, run
        assert run["losses"] == pytest.approx(reference["losses"], rel=1e-4)
        assert run["speedup"] == pytest.approx(run["tokens_per_s"] / reference["tokens_per_s"])
        assert run["efficiency"] == pytest.approx(run["speedup"] / 2)
    assert result["host_rates"]["threads"] == 1 and result["environment"]["device_type"] == "cpu"
    printed = capsys.readouterr().out
    assert "| tp | 2 |" in printed and "Strong scaling" in printed


@pytest.mark.parametrize("flags, line", [
    (["--ranks", "0"], "error: --ranks must be at least 1, got 0"),
    (["--steps", "2", "--warmup-steps", "2"], "error: --warmup-steps 2 leaves no step of the 2 to time"),
    (["--tolerance", "0"], "error: --tolerance must be above 0"),
    (["--ranks", "4", "--global-batch", "6"], "error: --global-batch 6 does not split over the 4 data-parallel ranks"),
    (["--block-size", "300"], "error: --block-size 300 is longer than tiny's context of 256"),
])
def test_impossible_settings_are_refused_in_one_line_before_any_run(flags, line, tmp_path, monkeypatch):
    monkeypatch.setattr(multi_device, "measure", lambda cfg: pytest.fail("measured"))
    with pytest.raises(SystemExit) as stopped:
        multi_device.main([*flags, "--out", str(tmp_path / "out.json")])
    said = str(stopped.value.code)
    assert said.startswith(line) and len(said.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
