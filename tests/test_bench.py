"""bench/: the scorecard's five keys with numbers and units; every experiment in the registry in a tiny
configuration, through its command line (train.py and torchrun really run); out-of-memory caught and
reported as the limit; the registry complete; the report holds every section, from this run's results
and from the committed ones."""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import re
import shutil
import time
from pathlib import Path

import pytest
import torch

from bench import leaderboard, report, run_all
from bench.eval import scorecard
from bench.peers.decode_sides import SideError, Sides, SideSpec
from bench.experiment import Workspace
from bench.experiments import EXPERIMENTS
from bench.experiments.__main__ import main as run_experiment
from bench.experiments.__main__ import parser as experiments_parser
from bench.record import RESULTS_DIR
from bench.run_all import RunAllConfig
from model.gpt import GPT
from model.packed_linear import PACKED
from runtime.cli import dataclass_from_args, to_flags
from runtime.device import is_out_of_memory
from runtime.errors import UserError

FIVE_KEYS = ("loss", "inference_latency_1", "inference_latency_12", "training_throughput_4", "training_throughput_12")
TEXT = ("The quick brown fox jumps over the lazy dog while the committee debates the budget for the new "
        "railway station, which was opened in 1887 and rebuilt after the war. ") * 30
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


# speculative trains its models: tests/test_speculative_bench.py; one_off_decode starts a process per call, and the
# paths it times have their tests in tests/test_decode_trace.py; tp_vs_fsdp's two trainings under torchrun are
# tests/test_parallel.py's (equal to single-device training), and its tiny run here cost 14 s of make test;
# data_prep's tokenizing paths are tests/test_data.py's, and its tiny run (a process per path) cost 12 s;
# playground drives a browser, against the page that tests/test_playground.py drives already; precision_memory
# runs train.py once per setting (train.py's runs are tests/test_train.py's, recomputed activations' gradients
# tests/test_model.py's), and its tiny run cost 8 s; user_start runs processes through timed spans of load (its
# summary is tests/test_user_start.py's, the choices it times tests/test_step_threads.py's and test_trace_payback.py's);
# fused_step compiles a step per row count in two processes (tens of seconds each) and checks its own logits against
# the traced step's in every run.
NOT_RUN = ("batch_sweep", "faults", "speculative", "one_off_decode", "tp_vs_fsdp", "data_prep", "playground",
           "precision_memory", "first_request", "prefix_cache", "user_start", "fused_step")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every experiment but those in NOT_RUN once, tiny, into one results folder
    (the report test reads them all).  The drills' behaviours are tests of their own (test_folder, test_damage,
    test_serve_*, test_parallel)."""
    root = tmp_path_factory.mktemp("bench")
    results_dir = root / "results"
    torch.manual_seed(0)
    from runtime.provenance import provenance
    from storage.artifact import save_artifact
    from tests.conftest import small_config
    model = GPT(small_config())
    save_artifact(root / "artifact", model, model.config, "float", provenance("tests"))
    (root / "eval.txt").write_text(TEXT)
    out = {"root": root, "dir": results_dir}
    said = io.StringIO()
    with contextlib.redirect_stderr(said):  # its estimates and progress lines (a module fixture has no capsys)
        out["score"] = leaderboard.main(["--checkpoint", str(root / "artifact"), "--eval-text",
                                         str(root / "eval.txt"), "--new-tokens", "4", "--repeats", "1", "--block-size",
                                         "16", "--train-steps", "1", "--device", "cpu", "--out",
                                         str(results_dir / "leaderboard.json")])
    out["score_said"] = said.getvalue()

    def run(name, *flags):
        out[name] = run_experiment([name, *flags, "--results-dir", str(results_dir), "--work-dir", str(root / name)])

    run("data_loading", "--block-size", "16", "--batch-size", "2", "--batches", "3", "--repeats", "1",
        "--max-workers", "1")
    run("phase_profile", "--block-size", "16", "--batch-size", "2", "--steps", "2", "--eval-interval", "1",
        "--eval-batches", "1", "--profile-steps", "1", "--device", "cpu")
    # Several ranks on one machine run on the CPU (gloo) even where a GPU is present.
    tiny_parallel = ["--device", "cpu", "--block-size", "16", "--steps-per-window", "1", "--windows", "1"]
    run("comm_strategies", "--modes", "allreduce", "--world-sizes", "1", "2", "--global-batch", "2", *tiny_parallel)
    run("compression", "--checkpoint", str(root / "artifact"), "--methods", "magnitude", "--rounds", "1",
        "--finetune-steps", "1", "--batch-size", "2", "--block-size", "16", "--eval-batches", "1", "--speed-repeats",
        "1", "--new-tokens", "4", "--speed-seq-len", "16")
    run("train_speed", "--shapes", "tiny:2x16", "tiny:1x8", "--steps", "1", "--repeats", "1",
        "--device", "cpu")
    run("generate_speed", "--model", "tiny", "--prompt-tokens", "4", "--new-tokens", "4", "--batch-sizes", "1",
        "--busy-cores", "0", "--slowed", "one-core", "--repeats", "1", "--device", "cpu", "--decode", "dynamic",
        "--no-onnx",
        "--no-llama-cpp", "--no-transformers")
    # (the peers and the traced steps have tests of their own)
    # auto (the server's default) beside dynamic; no huge-page pass in this process, whose wait (after the warm-up
    # call) would go through this test process's whole memory
    run("serve_speed", "--model", "tiny", "--new-tokens", "3", "--clients", "2", "--repeats", "1", "--device", "cpu",
        "--decode", "auto", "dynamic", "--no-huge-pages")
    run("prune_speed", "--preset", "tiny", "--seq-len", "8", "--generation-tokens", "2", "--repeats", "1",
        "--csr-sparsities", "0.9", "--device", "cpu")
    return out


def test_scorecard_has_the_five_keys_with_numbers_and_units(results):
    score = results["score"]
    for key in FIVE_KEYS:
        assert isinstance(score[key], float) and score[key] > 0, key
        assert score["units"][key] and score["definitions"][key]
        assert score["spread"].get(key, {"median": score[key]})["median"] == score[key]
    assert "tokens per second" in score["units"]["inference_latency_1"]
    assert score["loss"] > 5  # an untrained model on English text: close to ln(vocab) ~ 10.8
    assert score["time_to_first_token_s"] > 0 and score["ms_per_token_batch_1"] > 0
    assert score["artifact"]["kind"] == "float"
    assert score["environment"]["world_size"] == 1 and score["environment"]["git_commit"]
    assert score["generation"]["new_tokens"] == 4
    assert score["evaluation"]["targets"] == score["evaluation"]["tokens"] - 1  # the whole text, every target
    assert (score["evaluation"]["dataset"], score["evaluation"]["dataset_chosen"]) == \
        (str(results["root"] / "eval.txt"), "from --eval-text")
    assert score["protocol"]["name"] == "default" and score["protocol"]["grad_accum"] == 1
    assert json.loads((results["dir"] / "leaderboard.json").read_text())["loss"] == score["loss"]


def test_the_scorecard_estimates_each_part_after_its_first_unit_of_work(results):
    said = results["score_said"].splitlines()
    for expected in (r"estimate: first validation batch .+, about .+ for the other \d+ ",
                     r"estimate: a generation call at batch 1 took .+: about .+ for its 1 timed repeats; then batch 12",
                     r"estimate: a generation call at batch 12 took .+; then 2 training runs",
                     r"estimate: the first training run took .+; about .+ for the rest"):
        assert any(re.match(expected, line) for line in said), (expected, said)


def test_reference_protocol_needs_room_for_its_500_new_tokens(results):
    with pytest.raises(SystemExit, match="--protocol reference generates 500 new tokens .* context of 64"):
        leaderboard.main(["--checkpoint", str(results["root"] / "artifact"), "--eval-text",
                          str(results["root"] / "eval.txt"), "--protocol", "reference"])


def test_leaderboard_refuses_what_cannot_work(small_artifact, tmp_path):
    with pytest.raises(SystemExit, match="is not a file"):
        leaderboard.main(["--checkpoint", small_artifact, "--eval-text", str(tmp_path / "missing.txt")])
    (tmp_path / "t.txt").write_text(TEXT)
    with pytest.raises(SystemExit, match="exceeds the model's context of 64"):
        leaderboard.main(["--checkpoint", small_artifact, "--eval-text", str(tmp_path / "t.txt"), "--new-tokens", "60"])
    with pytest.raises(SystemExit, match="--dataset or --eval-text, not both"):
        leaderboard.main(["--checkpoint", small_artifact, "--eval-text", str(tmp_path / "t.txt"), "--dataset", "builtin"])
    with pytest.raises(SystemExit, match="--repeats must be at least 1, got 0"):
        leaderboard.main(["--checkpoint", small_artifact, "--repeats", "0"])


def test_batch_sweep_reports_an_allocation_failure_as_the_limit(tmp_path, monkeypatch):
    forward = GPT.forward

    def failing_forward(self, idx, *args, **kwargs):
        if idx.size(0) >= 4:
            raise torch.OutOfMemoryError("forced allocation failure")
        return forward(self, idx, *args, **kwargs)

    monkeypatch.setattr(GPT, "forward", failing_forward)
    result = run_experiment(["batch_sweep", "--block-size", "8", "--max-batch", "64", "--steps", "1", "--repeats", "1",
                             "--results-dir", str(tmp_path)])
    assert [r.batch_size for r in result.rows] == [1, 2]
    assert (result.limit.batch_size, result.limit.reason) == (4, "out of memory")
    assert all(r.tokens_per_s.median > 0 and r.epoch_equivalent_s > 0 for r in result.rows)
    assert (tmp_path / "batch_sweep.png").stat().st_size > 0
    assert json.loads((tmp_path / "batch_sweep.json").read_text())["limit"]["batch_size"] == 4


def test_cpu_allocation_failures_count_as_out_of_memory_and_nothing_else_does():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


def test_experiment_settings_are_checked_with_a_one_line_error():
    with pytest.raises(SystemExit, match="--steps must be at least 1, got 0"):
        run_experiment(["batch_sweep", "--steps", "0"])
    with pytest.raises(SystemExit, match="--world-sizes must be at least 1"):
        run_experiment(["comm_strategies", "--world-sizes", "2", "0"])
    with pytest.raises(SystemExit, match=r"--shapes 'gpt2:1024' is not PRESET:BATCHxBLOCK \(e.g. gpt2:1x1024\)"):
        run_experiment(["train_speed", "--shapes", "gpt2:1024"])
    with pytest.raises(SystemExit, match="no preset 'gpt3'"):
        run_experiment(["train_speed", "--shapes", "gpt3:1x8"])


def test_data_loading_measures_each_worker_count(results):
    rows = results["data_loading"].rows
    assert [r.num_workers for r in rows] == [None, 0, 1]
    assert all(r.per_batch_s.median > 0 for r in rows)


def test_phase_profile_accounts_for_the_whole_time(results):
    res = results["phase_profile"]
    assert set(res.phase_s) == {"data", "forward", "backward", "optimizer", "evaluation", "other"}
    assert sum(res.phase_s.values()) == pytest.approx(res.total_s, rel=1e-6)
    assert res.phase_s["evaluation"] > 0 and res.phase_s["backward"] > 0
    assert Path(res.profiler.trace).stat().st_size > 0 and res.profiler.top_ops


def test_communication_bytes_match_theory_and_scaling_is_relative_to_one_rank(results):
    res = results["comm_strategies"]
    one, two = res.rows
    assert one.error is None and two.error is None, (one.error, two.error)
    assert one.sent_bytes_per_step == 0 and two.sent_bytes_per_step > 0
    assert two.sent_bytes_per_step == pytest.approx(two.sent_bytes_theory_per_step, rel=1e-6)
    assert len(two.peak_memory_bytes_per_rank) == 2
    assert [s.speedup for s in res.strong_scaling][0] == 1.0
    assert res.strong_scaling[1].speedup == pytest.approx(one.iteration_s.median / two.iteration_s.median)


def test_compression_gathers_prune_and_quantize_reports(results):
    res = results["compression"]
    assert [r.sparsity for r in res.pruning["magnitude"].rounds][0] == 0.0
    assert res.pruning["magnitude"].rounds[-1].sparsity == pytest.approx(0.5, abs=0.01)
    loss = res.quantization.val_loss
    assert loss.float > 0 and loss.int8 > 0 and loss.change_pct is not None
    assert res.quantization.size_bytes.int8 > 0


def test_speed_comparisons_time_each_side_in_the_same_run(results):
    train = results["train_speed"]
    assert [(shape.batch_size, shape.block_size) for shape in train.shapes] == [(2, 16), (1, 8)]
    for shape in train.shapes:  # no nanoGPT checkout given
        assert list(shape.tokens_per_s) == ["ours"] and shape.tokens_per_s["ours"].n == 1
        assert shape.ratio_ours_over_nanogpt is None
    generation = results["generate_speed"]  # every side in its own process
    # One batch size: a second doubled generate_speed's share of this fixture (44 s of CPU on a busy host), and
    # each batch size runs the same loop over the sides.  No busy-core row: its loop beside the sides is
    # bench/peers/colocated.py's (tested below), and it spent a core of make test for the row's span.
    assert [(r.batch, r.host) for r in generation.results] == [(1, "quiet"), (1, "one core")]
    for row in generation.results:  # the host's rates under each condition, on one core with one thread there
        assert row.host_rates.read_gb_per_s > 0 and row.host_rates.matmul_gflop_per_s > 0
        assert (row.host_rates.threads, row.host_rates.cpus) == (1, [0]) if row.host == "one core" else True
    assert generation.decode == "dynamic"
    assert generation.linear_kernels.endswith(PACKED)
    for row in generation.results:
        assert set(row.sides) == {"ours fp32", "ours int8"} and len(row.load_average) == 1
        for side in row.sides.values():
            assert side.tokens_per_s.median > 0 and side.tokens_per_s.n == 1 and side.first_token_s.median > 0
            assert 0 <= side.token_agreement <= 1
        assert row.sides["ours fp32"].identical_tokens and row.comparisons == []  # no peer, no eager twin
    bandwidth = generation.bandwidth  # batch 1: weight bytes per step against the machine's read bandwidth
    assert bandwidth.read_gb_per_s.median > 0 and bandwidth.read_gb_per_s.n == 10
    assert 0 < bandwidth.int8_step_bytes < bandwidth.fp32_step_bytes
    # a side whose decode steps were lost in the timing noise (tiny, 4 tokens) has no rate: see the test below
    assert set(bandwidth.gb_per_s) == {name for name, side in generation.results[0].sides.items()
                                       if side.decode_tokens_per_s is not None}
    served = results["serve_speed"]  # a server with its default steps beside one with eager (dynamic) steps
    assert [d.decode for d in served.decodes] == ["auto", "dynamic"] and served.weights == "fp32"
    for decode in served.decodes:
        assert [level.clients for level in decode.levels] == [1, 2] and decode.levels[0].over_one_client is None
        assert decode.one_client_over_generate > 0 and decode.levels[1].over_one_client > 0
        for level in decode.levels:
            assert level.tokens_per_s.n == 1 and level.latency_ms.p50 <= level.latency_ms.p95 <= level.latency_ms.p99
            assert 0 < level.first_token_ms.p50 <= level.latency_ms.p50
    assert served.decodes[0].first_over_this is None
    # the first mode's server started twice: one client of each in every round, the floor under its ratios
    assert served.decodes[0].one_client_over_twin > 0 and served.decodes[1].one_client_over_twin is None
    assert set(served.decodes[1].first_over_this) == {"generate()", "1 client", "2 clients"}
    pruned = results["prune_speed"]
    assert pruned.parameters["row_pruned"] < pruned.parameters["dense"]
    assert pruned.row.generation.speedup > 0 and [r.sparsity for r in pruned.csr] == [0.9]


def test_report_holds_every_table_and_plot(results, tmp_path):
    out = report.write_report(results["dir"], tmp_path / "REPORT.md")
    text = out.read_text()
    # the experiments this fixture did not run, and the report says so (the line experiment_section writes; the
    # by-hand appendix's prose may say "not run" of anything)
    assert text.count("*Not run: `") == len(NOT_RUN)
    for heading in ("Scorecard", "3. Data loading", "4. Phase profile", "5. Precision",
                    "6. Communication", "8. Compression", "9. Training step", "10. Decoding",
                    "11. Serving", "12. Pruned"):
        assert heading in text
    for experiment in (e for e in EXPERIMENTS if e.name not in NOT_RUN):
        image = f"{experiment.name}.png"
        assert f"![{image}](" in text and (results["dir"] / image).exists()
    assert "CPU figures, not GPU figures" in text
    assert f"{results['score']['loss']:.4f}" in text


def test_the_registry_lists_every_experiment_module():
    modules = {p.stem for p in (Path(__file__).parent.parent / "bench" / "experiments").glob("*.py")
               if not p.stem.startswith("__")}
    names = [e.name for e in EXPERIMENTS]
    assert sorted(names) == sorted(modules) and len(set(names)) == len(names)
    for experiment in EXPERIMENTS:
        assert importlib.import_module(f"bench.experiments.{experiment.name}").EXPERIMENT is experiment


@pytest.mark.parametrize("experiment", EXPERIMENTS, ids=lambda e: e.name)
def test_each_experiment_declares_quick_and_full_settings_its_command_line_reproduces(experiment, tmp_path):
    workspace = Workspace(tmp_path)
    for size in ("quick", "full"):
        settings = getattr(experiment, size)
        assert isinstance(settings, experiment.settings), size
        command = experiment.command(settings, workspace)
        assert command[1:4] == ["-m", "bench.experiments", experiment.name]
        assert dataclass_from_args(experiment.settings, experiments_parser().parse_args(command[3:])) == settings
    assert experiment.quick != experiment.full
    if experiment.gpu is not None:
        command = experiment.command(experiment.gpu, workspace)
        assert dataclass_from_args(experiment.settings, experiments_parser().parse_args(command[3:])) == experiment.gpu


def test_the_gpu_profile_runs_the_peer_comparisons_into_their_own_folder(tmp_path):
    nanogpt = tmp_path / "nanoGPT"
    nanogpt.mkdir()
    (nanogpt / "model.py").write_text("")
    cfg = RunAllConfig(results_dir=tmp_path, nanogpt=str(nanogpt))
    commands = run_all.gpu_stage_commands(cfg)
    assert list(commands) == ["train_speed", "generate_speed", "serve_speed"]
    for command in commands.values():
        assert command[command.index("--results-dir") + 1] == str(tmp_path / "gpu")
    train = commands["train_speed"]
    assert train[train.index("--nanogpt") + 1] == str(nanogpt) and "--compile" in train
    assert train[train.index("--shapes") + 1] == "gpt2:12x1024"
    assert run_all.uses_gpu_profile(RunAllConfig(profile="cpu")) is False
    if not torch.cuda.is_available():
        assert run_all.uses_gpu_profile(RunAllConfig()) is False
        with pytest.raises(UserError, match="--profile gpu needs a CUDA device"):
            run_all.uses_gpu_profile(RunAllConfig(profile="gpu"))


def test_the_report_has_a_gpu_section_from_the_gpu_results(results, tmp_path):
    results_dir = tmp_path / "results"
    shutil.copytree(results["dir"], results_dir)
    text = report.write_report(results_dir, tmp_path / "REPORT.md").read_text()
    assert "## GPU\n" in text and "*Not measured: `results/gpu/` holds no results." in text
    gpu = results_dir / "gpu"
    gpu.mkdir()
    for name in ("train_speed", "generate_speed"):  # as a GPU run would leave them; serve_speed did not run
        shutil.copy(results_dir / f"{name}.json", gpu)
        shutil.copy(results_dir / f"{name}.png", gpu)
    text = report.write_report(results_dir, tmp_path / "REPORT.md").read_text()
    gpu_part = text[text.index("## GPU\n"):text.index("## Conditions")]
    assert "**Machine:**" in gpu_part and "Not measured" not in gpu_part
    assert "### Training step against nanoGPT (`bench/experiments/train_speed.py`, GPU settings)" in gpu_part
    assert "![train_speed.png](results/gpu/train_speed.png)" in gpu_part
    assert "*Not run: `gpu/serve_speed.json` is missing.*" in gpu_part


def test_the_report_renders_a_section_for_each_experiment_from_the_committed_results(tmp_path):
    text = report.write_report(RESULTS_DIR, tmp_path / "REPORT.md").read_text()
    for number, experiment in enumerate(EXPERIMENTS, 1):
        assert f"## {number}. {experiment.title} (`{experiment.source}`)" in text
        if (RESULTS_DIR / f"{experiment.name}.json").exists():  # it reads back as its typed result
            assert isinstance(experiment.read(RESULTS_DIR), experiment.result)
            assert f"`results/{experiment.name}.json` is missing" not in text
    assert "## Scorecard" in text and "## Conditions" in text


def test_flags_follow_train_py_conventions():
    assert to_flags({"batch_size": 4, "compile": True, "resume": False, "init_from": None,
                     "modes": ["ddp", "tp"]}) == \
        ["--batch-size", "4", "--compile", "--no-resume", "--modes", "ddp", "tp"]


def test_a_failed_train_run_is_reported_by_its_telling_line_not_torchrun_banner():
    from bench.train_runs import TrainRun
    tail = ("[rank1]: Traceback (most recent call last):\nterminate called without an active exception\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 54 + "\n")
    assert TrainRun([], 1, 3.0, [], tail).failure() == "exit code 1: terminate called without an active exception"
    own = "step 1/2: loss 10.7\nerror: --batch-size 3 does not divide over 2 ranks\n" + "=" * 54 + "\n"
    assert TrainRun([], 1, 3.0, [], own).failure() == "exit code 1: error: --batch-size 3 does not divide over 2 ranks"
    assert TrainRun([], 2, 3.0, [], "last words\n").failure() == "exit code 2: last words"


def test_the_scorecard_checks_its_data_before_loading_the_model(results, monkeypatch, tmp_path):
    monkeypatch.setattr(scorecard, "load_model", lambda *a, **k: pytest.fail("loaded the model before the data"))
    with pytest.raises(SystemExit, match=r"error: dataset .*nowhere.* is neither a known name"):
        leaderboard.main(["--checkpoint", str(results["root"] / "artifact"), "--dataset", str(tmp_path / "nowhere"),
                          "--device", "cpu", "--out", str(tmp_path / "card.json")])


def test_plot_legends_name_runs_by_the_path_parts_that_tell_them_apart():
    from training.curves import run_labels
    assert run_labels([Path("out/demo/train"), Path("out/demo/fsdp"), Path("out/train")]) == \
        ["demo/train", "fsdp", "out/train"]
    assert run_labels([Path("runs/ddp"), Path("runs/fsdp")]) == ["ddp", "fsdp"]


def test_a_side_that_cannot_start_is_named_with_its_error():
    with pytest.raises(SideError, match="side 'broken' failed:(.|\n)*unknown runtime 'no such runtime'"):
        Sides([SideSpec("broken", "no such runtime", (), threads=1)])


def test_fuzz_counts_every_attempt_per_surface_and_keeps_the_first_bad_messages(tmp_path):
    from tests.fuzz import KEPT_BAD_EXAMPLES, count, fuzz_report, table
    rows = [("corpus", "worked", ""), ("corpus", "refused", "")] + \
        [("signals", "bad message", f"exit -2: case {i}") for i in range(KEPT_BAD_EXAMPLES + 2)]
    attempts = tmp_path / "attempts.jsonl"
    attempts.write_text("".join(json.dumps({"surface": s, "outcome": o, "detail": d}) + "\n" for s, o, d in rows))
    corpus, signals = count(attempts)
    assert (corpus.surface, corpus.attempts, corpus.outcomes, corpus.bad_examples) == \
        ("corpus", 2, {"refused": 1, "worked": 1}, [])
    assert signals.attempts == KEPT_BAD_EXAMPLES + 2
    assert signals.bad_examples == [f"bad message: exit -2: case {i}" for i in range(KEPT_BAD_EXAMPLES)]
    report = fuzz_report("abc1234", 1.0, 1, ["FAILED x", "FAILED x"], [corpus, signals])
    assert (report.attempts, report.bad_messages, report.tracebacks, report.failed_properties) == \
        (KEPT_BAD_EXAMPLES + 4, KEPT_BAD_EXAMPLES + 2, 0, ["FAILED x"])
    assert "| signals | 7 | 0 | 0 | 0 | 7 | 0 |" in table(report)


def test_busy_cores_keep_running_through_the_block_and_end_with_it():
    from bench.peers.colocated import busy_cores
    with busy_cores(2) as processes:
        time.sleep(0.2)
        assert len(processes) == 2 and all(p.poll() is None for p in processes)
    assert all(p.poll() is not None for p in processes)


def test_prefix_cache_reports_llama_server_beside_its_own_sides(tmp_path):
    """With --llama-server, the few-shot first token gains a row, a bar group and a speed-up per level; scoring stays
    ours only (the committed result, given a llama-server part)."""
    from bench.experiments import prefix_cache
    from bench.plots import plt
    from bench.report_page import Page
    from bench.typed_json import from_json, to_json
    from runtime.timing import Spread
    result = prefix_cache.EXPERIMENT.read(RESULTS_DIR)
    older = to_json(result)
    older.pop("llama_server")  # as a result written before the option was
    assert from_json(prefix_cache.PrefixCacheResult, json.loads(json.dumps(older))).llama_server is None
    levels = list(result.first_token_speedup)
    result.llama_server = prefix_cache.PeerFewShot("llama-server 1 (commit abc), F32", "its defaults",
                                                   {lv: Spread(900.0, 800.0, 1000.0, 2) for lv in levels},
                                                   {lv: 3.0 for lv in levels})
    assert from_json(prefix_cache.PrefixCacheResult, json.loads(json.dumps(to_json(result)))) == result
    page = Page(tmp_path / "REPORT.md")
    prefix_cache.EXPERIMENT.section(result, page)
    text = "".join(page.parts)
    assert "| llama-server 1 (commit abc), F32 | n/a | " + " | ".join(["900 (800-1,000)"] * len(levels)) + \
        " | n/a | n/a |" in text
    assert "ours with the cache over llama-server, first token (medians of per-round ratios): " + \
        ", ".join(f"{lv} 3.00x" for lv in levels) in text
    figure = prefix_cache.EXPERIMENT.plot(result)
    legend = [t.get_text() for t in figure.axes[1].get_legend().get_texts()]
    plt.close(figure)
    assert legend == ["prefix cache off", "prefix cache on", "llama-server, its defaults"]


def test_a_decode_time_lost_in_the_timing_noise_is_reported_as_not_measured(results, tmp_path):
    """A round whose one-token call outlasts its whole call gives no decode-only rate (not a negative one): the
    side's figure and every ratio with it are None, the table says n/a once with why, and the result reads back."""
    from dataclasses import replace

    from bench.experiments.generate_speed import NOT_MEASURED, GenerateSpeed, decode_seconds, plot, section
    from bench.record import read_result, write_result
    from bench.report_page import Page
    assert decode_seconds([1.0, 2.0], [0.5, 0.5]) == [0.5, 1.5]
    assert decode_seconds([1.0, 2.0], [0.5, 2.0]) is None and decode_seconds([1.0], [1.5]) is None
    generation = results["generate_speed"]
    row = generation.results[0]
    lost = replace(row.sides["ours int8"], decode_tokens_per_s=None)
    result = replace(generation, results=[replace(row, sides={**row.sides, "ours int8": lost})])
    page = Page(tmp_path / "REPORT.md")
    section(result, page)
    text = page.text()
    assert text.count(NOT_MEASURED) == 1 and "| ours int8 |" in text and "| n/a |" in text
    plot(result)  # draws the side's end-to-end bar and labels its missing one
    write_result(tmp_path, "generate_speed", result)
    assert read_result(tmp_path, "generate_speed", GenerateSpeed).results[0].sides["ours int8"] == lost
