"""Mutation testing of the modules that guard input and files (`make mutate`): does the suite notice when a guard
is broken?  Cosmic Ray (requirements-mutate.txt) changes one thing at a time in a module -- a number, a comparison,
an operator, an exception caught, a decorator -- and runs the module's tests against each change (a "mutant"); a
mutant the tests still pass on "survived", which names a check no test holds.

    python -m tests.mutation                           # every module below; writes bench/results/mutation.json
    python -m tests.mutation --modules runtime/cli.py  # some of them
    python -m tests.mutation --changed                 # those changed against main (the habit before a stop)

Each module is mutated in scratch copies of the working tree, one per worker (Cosmic Ray edits the file it
mutates; --workers mutants are tested at once, through Cosmic Ray's http distributor), and its tests
-- its surface's hostile suite and its own, listed in MODULES, fastest first -- run with `-x`, so a killed mutant
costs only the tests up to the first failure.  Counted per module: mutants, killed, timed out (also detected: a
mutant that hangs a guard), survived, and those left out with the reason (outside the checks asked for, or a type
annotation's union, which only a type checker reads).  A survivor that cannot change behaviour is listed in
tests/mutation_equivalents.json with its reason and counted as equivalent, not survived.  The score is detected /
(mutants - equivalent).  PLANTED holds defects planted by hand (issue 54's round), each run against its module's
tests and reported killed or not.  Results go under a label (`--label before`, `--label after`), so a file keeps
the figures before and after new tests; a run that stops keeps the modules it finished.
"""
from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch

from bench.processes import ROOT
from bench.record import RESULTS_DIR
from bench.typed_json import to_json
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.errors import UserError
from runtime.timing import environment
from tests.warm_pytest import THEN

EQUIVALENTS_FILE = ROOT / "tests" / "mutation_equivalents.json"
KILLED_EARLIER = "killed in an earlier run"
PYTEST = ["-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
SOCKET = "warm-pytest.socket"
BASELINE_LIMIT_S = 1800.0


@dataclass(frozen=True)
class Target:
    """A module to mutate: its tests (files or node ids, fastest first) and, where only part of it is the guard,
    the definitions whose lines are mutated."""
    tests: tuple[str, ...]
    only: tuple[str, ...] = ()  # function or class names; empty: the whole module


# Each module's tests: those that exercise it, fastest first (a killed mutant stops at the first failure), then its
# surface's hostile suite, its random properties last.  A surviving mutant runs the whole selection, so whole slow
# files (tests/test_serve_api.py's 80 app starts, tests/test_folder.py's trainings) are left out for the tests of
# theirs that reach the module.
def hostile(path: str, slowest: tuple[str, ...] = (), omit: tuple[str, ...] = ()) -> tuple[str, ...]:
    """A suite's tests by node id, its slowest ones last, those of `omit` (trainings, hub look-ups) left out."""
    names = [line.split("(")[0].removeprefix("def ") for line in (ROOT / path).read_text().splitlines()
             if line.startswith("def test_")] if (ROOT / path).exists() else []
    return (*(f"{path}::{n}" for n in names if n not in slowest and n not in omit),
            *(f"{path}::{n}" for n in slowest if n in names))


HOSTILE_HTTP = hostile("tests/test_hostile_http.py", ("test_drawn_requests_get_documented_replies_and_no_server_error",))
HOSTILE_DATA = hostile("tests/test_hostile_data.py", (
    "test_train_py_stops_on_files_it_cannot_use_or_trains_without_them_when_told",))
SCHEMA_TESTS = ("tests/test_serve_schemas.py", "tests/test_serve_api.py::test_bad_fields_are_named", *HOSTILE_HTTP)
# tests/test_data.py without its two-rank training and its hub and built-in corpus look-ups (some 45 s of its 55).
DATA_TESTS = (*HOSTILE_DATA, *hostile("tests/test_data.py", omit=(
    "test_two_ranks_tokenize_once", "test_builtin_corpus_is_named_for_what_it_is",
    "test_unreachable_hub_error_names_alternatives")))
# data/local_files.py's checks of what it is given: the reading of each format, the choice of files and the refusals;
# not the listing of sizes, the content key or the carving of validation text.
LOCAL_FILE_CHECKS = ("file_hash", "_table_rows", "_column_texts", "_holds_strings", "_lines", "_jsonl_rows",
                     "corpus_files", "run_folder_refused", "unusable_because", "format_problem", "unusable_checked",
                     "data_file", "_kind", "local_corpus")
TOKEN_FILE_TESTS = ("tests/test_hostile_data.py::test_a_token_file_is_read_only_when_every_part_of_it_is_whole",
                    "tests/test_data.py::test_damaged_token_file_is_reported",
                    "tests/test_hostile_data.py::test_damaged_token_files_name_the_damage",
                    "tests/test_hostile_data.py::test_any_damaged_token_file_is_one_error_line")
CLAIM_TESTS = ("tests/test_claim.py", "tests/test_claim_edges.py", "tests/test_storage.py",
               "tests/test_hostile_data.py::test_an_out_dir_inside_the_dataset_is_refused_before_anything_is_written",
               "tests/test_train.py::test_a_refused_start_leaves_no_new_out_dir",
               "tests/test_hostile_artifacts.py::test_an_output_folder_that_is_the_source_under_any_name_is_refused",
               "tests/test_hostile_artifacts.py::test_a_hard_linked_copy_of_the_source_may_be_overwritten_without_"
               "touching_the_source",
               "tests/test_folder.py::test_a_tool_refuses_another_tools_artifact_unless_told_to_overwrite")
CLI_TESTS = ("tests/test_cli.py", "tests/test_hostile_cli.py")
TWO_WRITERS = "test_two_processes_writing_at_once_keep_every_entry_and_a_reader_sees_whole_files"
# In the order a whole run takes them: the quickest to mutate first, so a run cut short has finished the most.
MODULES = {
    "runtime/install.py": Target(("tests/test_install.py", "tests/test_hostile_install.py"), only=("pip_settings",
                                                                                                  "uv_flags")),
    "data/token_files.py": Target(TOKEN_FILE_TESTS, only=("read_tokens",)),
    "quantize/dynamic.py": Target(("tests/test_tool_configs.py", "tests/test_quantize.py::test_bad_input_gets_a_"
                                   "clear_error", *CLI_TESTS), only=("QuantizeConfig",)),
    "prune/config.py": Target(("tests/test_tool_configs.py", "tests/test_prune.py::test_bad_input_gets_a_clear_error",
                               *CLI_TESTS)),
    "storage/claim.py": Target(CLAIM_TESTS),
    "serve/schemas.py": Target(SCHEMA_TESTS),
    "serve/prompts.py": Target(("tests/test_serve_prompts.py",
                                "tests/test_serve_api.py::test_token_id_prompts_work_as_the_text_they_encode",
                                "tests/test_serve_api.py::test_openai_request_checks", *HOSTILE_HTTP)),
    "serve/errors.py": Target(("tests/test_serve_errors.py", "tests/test_serve_api.py::test_bad_fields_are_named",
                               "tests/test_serve_api.py::test_malformed_bodies_get_4xx_with_a_message",
                               "tests/test_serve_api.py::test_unknown_paths_and_methods_answer_json", *HOSTILE_HTTP)),
    "runtime/cli.py": Target(("tests/test_cli_edges.py", *CLI_TESTS, "tests/test_config_file.py",
                              "tests/test_tool_configs.py")),
    # its own tests and the hostile suite, as issue 54 asks: tests/test_data.py's reach into it is those two's already
    "data/documents.py": Target(("tests/test_data_documents.py", *HOSTILE_DATA)),
    "data/local_files.py": Target(("tests/test_local_files.py", *DATA_TESTS), only=LOCAL_FILE_CHECKS),
    "decode/prefix_cache.py": Target(("tests/test_prefix_cache.py", "tests/test_hostile_cache_salt.py")),
    # issue 71: the doors' sampling knobs (logit_bias's keys and values), kept files, compressed streams
    "decode/request_sampling.py": Target(("tests/test_logit_adjust.py",
                                          "tests/test_sample.py::test_bad_bias_and_penalty_flags_are_one_line_naming_"
                                          "the_flag",
                                          "tests/test_sample.py::test_logit_bias_and_penalties_take_the_servers_form",
                                          "tests/test_sample.py::test_prompts_file_lines_of_the_wrong_type_or_"
                                          "encoding_fail_alone",
                                          "tests/test_hostile_cli.py::test_sample_json_of_any_length_and_depth_is_one_"
                                          "line_and_a_bad_prompts_line_fails_alone",
                                          "tests/test_hostile_http.py::test_bad_bias_and_penalties_are_one_line_naming_"
                                          "the_field")),
    # the two-writer test last: 13 s of the selection's 18, which every mutant it did not reach first paid
    "runtime/kept_file.py": Target((*hostile("tests/test_hostile_kept_files.py", omit=(TWO_WRITERS,)),
                                    "tests/test_kept_ratios.py", f"tests/test_hostile_kept_files.py::{TWO_WRITERS}")),
    # its own quick tests first; test_local_files reads compressed files and names their formats too
    "data/compressed.py": Target(("tests/test_compressed.py", "tests/test_data_documents.py", "tests/test_local_files.py",
                                  *HOSTILE_DATA)),
    "storage/folder.py": Target(("tests/test_folder_files.py", "tests/test_storage.py", "tests/test_claim.py",
                                  *hostile("tests/test_folder.py", omit=(
        "test_training_that_saves_every_step_is_undisturbed_by_a_reader_in_a_tight_loop",
        "test_training_on_a_full_disk_names_the_last_good_checkpoint")))),
}


@dataclass(frozen=True)
class Planted:
    """A defect planted by hand: `old` replaced by `new` (everywhere) in `module`."""
    name: str
    module: str
    old: str
    new: str
    tests: tuple[str, ...]


PLANTED = (
    Planted("a prefix-cache block key leaves out the block's last token", "decode/prefix_cache.py",
            "for t in tokens)).digest()", "for t in tokens[:-1])).digest()", ("tests/test_prefix_cache.py",)),
    Planted("a prefix-cache store files blocks behind a key that holds another block", "decode/prefix_cache.py",
            "if held is not None and (held.parent != parent or held.tokens != tokens):\n                return",
            "if False:\n                return", ("tests/test_prefix_cache.py",)),
    Planted("a deeply nested JSON line's RecursionError is no longer an error line", "runtime/parsed.py",
            "except (RecursionError, ValueError) as e:", "except ValueError as e:", ("tests/test_hostile_data.py",)),
    # issue 71's: each survived every test before it
    Planted("a string config field takes a TOML number", "runtime/cli.py",
            "    if not isinstance(value, str):\n        return f\"must be a string, got {_shown(value)}\", None",
            "    if not isinstance(value, (str, int)):\n        return f\"must be a string, got {_shown(value)}\", None",
            ("tests/test_config_file.py",)),
    Planted("a multi-frame .zst loses the frames after the first", "data/compressed.py",
            "self.leftover, self.stream, self.started = self.stream.unused_data, self.new(), False",
            "return None", ("tests/test_hostile_data.py",)),
    Planted("the upper bound on seed is gone", "serve/schemas.py", "seed: int | None = Field(None, ge=0, le=MAX_SEED)",
            "seed: int | None = Field(None, ge=0)", ("tests/test_hostile_http.py",)),
)


@dataclass
class MutationConfig:
    modules: list[str] = option(list(MODULES), f"modules to mutate, of: {', '.join(MODULES)}")
    changed: bool = option(False, "only the modules changed against --base (committed or not)")
    base: str = option("main", "the branch --changed compares with")
    label: str = option("latest", "the name this run's figures are kept under in mutation.json (before, after)")
    planted: bool = option(True, "also run the defects planted by hand (PLANTED)")
    leave_out: list[str] = option([], "tests (files or node ids) taken out of every module's selection: the suite "
                                      "as it was before tests written to kill survivors, for the before figures",
                                  may_be_empty=True)
    rerun_survivors_of: str | None = option(None, "run only the mutants that survived the run of this label (e.g. "
                                                  "before), counting the others as killed by it: new tests cannot "
                                                  "revive a killed mutant, so the after figures cost a fraction")
    timeout_factor: float = option(4.0, "a mutant's tests time out at this many times their unmutated duration "
                                        "(plus 30 s)", above=1)
    workers: int = option(len(os.sched_getaffinity(0)), "mutants tested at once, each in a copy of the tree of its "
                          "own (default: this host's cores, as a mutant's tests run mostly on one core)", min=1)
    results_dir: Path = option(RESULTS_DIR, "where mutation.json goes")

    def __post_init__(self):
        check_options(self, UserError)
        unknown = [m for m in self.modules if m not in MODULES]
        if unknown:
            raise UserError(f"--modules {' '.join(unknown)}: not a module this tool mutates; choose from "
                            f"{', '.join(MODULES)}")


@dataclass
class Mutant:
    line: int
    operator: str
    code: str  # the line as it was
    reason: str = ""  # why it is equivalent or left out


@dataclass
class ModuleResult:
    module: str
    tests: list[str]
    mutants: int  # mutated and run
    killed: int
    timed_out: int
    survived: int
    equivalent: list[Mutant]
    score: float  # (killed + timed out) / (mutants - equivalent)
    survivors: list[Mutant]
    left_out: dict[str, int] = field(default_factory=dict)  # reason -> mutants not run
    killed_earlier: int = 0  # of `killed`, those counted from --rerun-survivors-of's run, not run again
    baseline_s: float = 0.0  # the tests' time on the unmutated module
    wall_s: float = 0.0


@dataclass
class PlantedResult:
    name: str
    module: str
    killed: bool
    by: str  # the first failing test, or what the run said


def changed_modules(base: str) -> list[str]:
    """The modules of MODULES that differ from `base` (committed on this branch, or not yet)."""
    names = subprocess.run(["git", "diff", "--name-only", base], cwd=ROOT, capture_output=True, text=True)
    if names.returncode != 0:
        raise UserError(f"--changed: git cannot compare with {base!r} ({names.stderr.strip()}); give --base")
    changed = set(names.stdout.split())
    return [m for m in MODULES if m in changed]


def scratch_copy(where: Path) -> Path:
    """The working tree (tracked and untracked files git does not ignore) copied to `where`, with the tokenizer."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, where / name)
    assets = ROOT / "data" / "assets"
    if assets.exists():
        (where / "data" / "assets").symlink_to(assets.resolve())
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(where)], capture_output=True)  # once, not per test
    # A repository of its own, its one commit the copied tree: tests that ask git about the checkout (a --baseline
    # of HEAD) see one, as they do in the working tree.
    git = ["git", "-c", "user.name=mutation", "-c", "user.email=mutation@localhost", "-c", "commit.gpgsign=false"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "--no-verify", "-m", "the tree mutated"]):
        subprocess.run([*git, *command], cwd=where, capture_output=True, check=True)
    return where


def test_command(tests: tuple[str, ...], timeout: float) -> list[str]:
    """pytest on `tests`, in a fork of the warm server (tests/warm_pytest.py), cut off at `timeout` seconds: the
    tests of the first file on their own, then the rest if they passed, so that most mutants, killed by a module's own quick
    tests, never wait for the collection of the slower files.  Paths are relative: it runs in the copy at hand (each
    worker's own, with its own server)."""
    first = tests[0].split("::")[0]
    quick = next((i for i, t in enumerate(tests) if t.split("::")[0] != first), len(tests))
    stages = [*PYTEST, *tests[:quick]] + ([THEN, *PYTEST, *tests[quick:]] if quick < len(tests) else [])
    return ["env", "PYTHONPATH=.", sys.executable, "-m", "tests.warm_pytest", "run", SOCKET, f"{timeout:.0f}", "--",
            *stages]


@contextlib.contextmanager
def http_worker(copy: Path) -> Iterator[str]:
    """A Cosmic Ray worker mutating and testing in `copy`, for the length of the block; yields its URL."""
    with socket.socket() as probe:  # a free port, as the system hands one out
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    worker = subprocess.Popen([sys.executable, "-m", "cosmic_ray.cli", "http-worker", "--port", str(port)], cwd=copy,
                              env={**os.environ, "PYTHONPATH": str(copy)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if worker.poll() is not None or time.monotonic() > deadline:
                raise UserError(f"a Cosmic Ray http-worker did not start on port {port} (exit {worker.poll()})")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        worker.kill()
        worker.wait()


@contextlib.contextmanager
def warm_server(copy: Path):
    """tests/warm_pytest.py's server over the copy, for the length of the block."""
    server = subprocess.Popen(["env", f"PYTHONPATH={copy}", sys.executable, "-m", "tests.warm_pytest", "serve",
                               str(copy / SOCKET)], cwd=copy, stdout=subprocess.PIPE, text=True)
    try:
        if server.stdout.readline().strip() != "ready":
            raise UserError("the warm pytest server (tests/warm_pytest.py) did not start")
        yield
    finally:
        server.kill()
        server.wait()


def definition_lines(path: Path, names: tuple[str, ...]) -> set[int]:
    tree = ast.parse(path.read_text())
    return {line for node in ast.walk(tree) if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in names
            for line in range(node.lineno, node.end_lineno + 1)}


def annotation_lines(path: Path) -> set[int]:
    """Lines holding a type annotation, or a type alias's union at module level (`X = A | B`)."""
    tree, lines = ast.parse(path.read_text()), set()
    for node in ast.walk(tree):
        annotations = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotations = [a.annotation for a in (*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs,
                                                  node.args.vararg, node.args.kwarg) if a and a.annotation]
            annotations += [node.returns] if node.returns else []
        elif isinstance(node, ast.AnnAssign):
            annotations = [node.annotation]
        for annotation in annotations:
            lines.update(range(annotation.lineno, annotation.end_lineno + 1))
    for node in tree.body:  # Name = Annotated[...] | ...: a type written as a value
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.BitOr) \
                and any(isinstance(n, ast.Subscript) for n in ast.walk(node.value)):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def equivalents() -> list[dict]:
    return json.loads(EQUIVALENTS_FILE.read_text())["equivalent"] if EQUIVALENTS_FILE.exists() else []


def is_equivalent(module: str, mutant: Mutant, listed: list[dict]) -> str:
    """The reason `mutant` is listed as equivalent, or ""."""
    return next((e["reason"] for e in listed if e["module"] == module and e["operator"] == mutant.operator
                 and e["code"] == mutant.code), "")


def cosmic_ray(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "cosmic_ray.cli", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"cosmic-ray {args[0]} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return done


def baseline(copy: Path, tests: tuple[str, ...]) -> float:
    started = time.perf_counter()
    run = subprocess.run(test_command(tests, BASELINE_LIMIT_S), cwd=copy, capture_output=True, text=True)
    if run.returncode != 0:
        raise UserError(f"the tests {' '.join(tests)} fail on the unmutated code (pytest exit {run.returncode}; "
                        f"run them alone to see why); fix them first")
    return time.perf_counter() - started


def earlier_survivors(cfg: MutationConfig, module: str) -> set[tuple[int, str, str]] | None:
    """(line, operator, code) of the mutants of `module` that survived --rerun-survivors-of's run (equivalent ones
    included); None: run all."""
    if cfg.rerun_survivors_of is None:
        return None
    path = cfg.results_dir / "mutation.json"
    earlier = json.loads(path.read_text())["runs"].get(cfg.rerun_survivors_of, {}) if path.exists() else {}
    if module not in earlier.get("modules", {}):  # not reached by that run: this one runs every mutant
        print(f"{module}: not in the {cfg.rerun_survivors_of} run; every mutant runs", flush=True)
        return None
    ran = earlier["modules"][module]
    return {(m["line"], m["operator"], m["code"]) for m in ran["survivors"] + ran["equivalent"]}


def mutate_module(module: str, target: Target, copy: Path, work: Path, cfg: MutationConfig,
                  workers: list[str]) -> ModuleResult:
    """`workers`: the http-workers' URLs, each on a copy of its own; none: the mutants run one at a time in `copy`."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult
    started = time.perf_counter()
    target = Target(tuple(t for t in target.tests if (copy / t.split("::")[0]).exists() and t not in cfg.leave_out),
                    target.only)
    if cfg.leave_out:  # a node id under a file left out goes with it
        target = Target(tuple(t for t in target.tests if t.split("::")[0] not in cfg.leave_out), target.only)
    took = baseline(copy, target.tests)
    print(f"{module}: its tests take {took:.0f} s unmutated", flush=True)
    config, db = work / f"{module.replace('/', '_')}.toml", work / f"{module.replace('/', '_')}.sqlite"
    limit = took * cfg.timeout_factor + 30  # the server ends a run here; Cosmic Ray's own limit is a backstop
    command = " ".join(test_command(target.tests, limit))
    distributor = (f'name = "http"\n[cosmic-ray.distributor.http]\nworker-urls = {json.dumps(workers)}\n' if workers
                   else 'name = "local"\n')
    config.write_text(f'[cosmic-ray]\nmodule-path = "{module}"\ntimeout = {limit + 60:.0f}\n'
                      f'excluded-modules = []\ntest-command = "{command}"\n[cosmic-ray.distributor]\n{distributor}')
    db.unlink(missing_ok=True)
    cosmic_ray("init", str(config), str(db), cwd=copy)
    source = (copy / module).read_text().splitlines()
    wanted = definition_lines(copy / module, target.only) if target.only else None
    typed = annotation_lines(copy / module)
    survived_before = earlier_survivors(cfg, module)
    left_out: dict[str, int] = {}
    killed_earlier = 0
    with use_db(str(db), WorkDB.Mode.open) as work_db:
        for item in list(work_db.pending_work_items):
            spec = item.mutations[0]
            line = spec.start_pos[0]
            if wanted is not None and line not in wanted:
                reason = f"outside {', '.join(target.only)}"
            elif line in typed and spec.operator_name.startswith("core/ReplaceBinaryOperator_BitOr"):
                reason = "a type annotation's union (read by type checkers, not run)"
            elif survived_before is not None and (line, spec.operator_name.removeprefix("core/"),
                                                  source[line - 1].strip()) not in survived_before:
                killed_earlier += 1
                work_db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=KILLED_EARLIER))
                continue
            else:
                continue
            left_out[reason] = left_out.get(reason, 0) + 1
            work_db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=reason))
        pending = len(list(work_db.pending_work_items))
    print(f"{module}: {pending} mutants to run ({sum(left_out.values())} left out)", flush=True)
    cosmic_ray("exec", str(config), str(db), cwd=copy)
    listed, killed, timed_out, equivalent, survivors = equivalents(), killed_earlier, 0, [], []
    with use_db(str(db), WorkDB.Mode.open) as work_db:
        for item, result in work_db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            spec = item.mutations[0]
            mutant = Mutant(spec.start_pos[0], spec.operator_name.removeprefix("core/"),
                            source[spec.start_pos[0] - 1].strip())
            if result.test_outcome == TestOutcome.SURVIVED:
                if reason := is_equivalent(module, mutant, listed):
                    equivalent.append(Mutant(**{**mutant.__dict__, "reason": reason}))
                else:
                    survivors.append(mutant)
            elif result.output == "timeout" or "timed out after" in (result.output or ""):
                timed_out += 1
            else:
                killed += 1
    mutants = killed + timed_out + len(equivalent) + len(survivors)
    score = (killed + timed_out) / max(1, mutants - len(equivalent))
    print(f"{module}: {mutants} mutants, {killed} killed, {timed_out} timed out, {len(survivors)} survived, "
          f"{len(equivalent)} equivalent: {score:.0%}", flush=True)
    return ModuleResult(module, list(target.tests), mutants, killed, timed_out, len(survivors), equivalent,
                        round(score, 3), sorted(survivors, key=lambda m: m.line), left_out, killed_earlier,
                        round(took, 1), round(time.perf_counter() - started, 1))


def run_planted(planted: Planted, copy: Path) -> PlantedResult:
    path = copy / planted.module
    original = path.read_text()
    if planted.old not in original:
        raise UserError(f"the planted defect {planted.name!r} no longer applies: {planted.module} no longer holds "
                        f"{planted.old!r}; update PLANTED")
    path.write_text(original.replace(planted.old, planted.new))
    try:
        run = subprocess.run(["env", f"PYTHONPATH={copy}", sys.executable, "-m", "pytest", *PYTEST, *planted.tests],
                             cwd=copy, capture_output=True, text=True)  # a process of its own: its output names the test
    finally:
        path.write_text(original)
    failed = [line for line in run.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    result = PlantedResult(planted.name, planted.module, run.returncode != 0,
                           failed[0][:300] if failed else run.stdout.strip().splitlines()[-1][:300])
    print(f"planted: {planted.name}: {'killed' if result.killed else 'SURVIVED'} ({result.by})", flush=True)
    return result


def save(cfg: MutationConfig, modules: dict[str, ModuleResult], planted: list[PlantedResult]) -> None:
    """mutation.json with this run under its label; the other labels' figures kept."""
    path = cfg.results_dir / "mutation.json"
    kept = json.loads(path.read_text()) if path.exists() else {}
    runs = kept.get("runs", {})
    previous = runs.get(cfg.label, {})
    runs[cfg.label] = {
        "modules": {**previous.get("modules", {}), **{m: to_json(r) for m, r in modules.items()}},
        "planted": [to_json(p) for p in planted] or previous.get("planted", []),
        "environment": to_json(environment(torch.device("cpu"))),
    }
    report = {"tool": "cosmic-ray 8.7.0", "command": "make mutate (python -m tests.mutation)",
              "score": "(killed + timed out) / (mutants - equivalent)", "runs": runs}
    cfg.results_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(path)


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(MutationConfig, __doc__, argv)
    try:
        import cosmic_ray  # noqa: F401
    except ImportError:
        raise UserError("Cosmic Ray is not installed: pip install -r requirements-mutate.txt (make mutate does)")
    modules = changed_modules(cfg.base) if cfg.changed else cfg.modules
    if cfg.changed:
        print(f"changed against {cfg.base}: {', '.join(modules) or 'none of the mutated modules'}", flush=True)
    results: dict[str, ModuleResult] = {}
    planted: list[PlantedResult] = []
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        copy, work = scratch_copy(Path(tmp) / "tree"), Path(tmp)
        if cfg.planted:
            planted = [run_planted(p, copy) for p in PLANTED if not cfg.changed or p.module in modules]
            save(cfg, results, planted)
        with contextlib.ExitStack() as stack:
            stack.enter_context(warm_server(copy))
            workers = []
            if cfg.workers > 1:  # each worker mutates its own copy, the first the one the baselines run in
                for i in range(cfg.workers):
                    tree = copy if i == 0 else scratch_copy(Path(tmp) / f"tree{i}")
                    if i:
                        stack.enter_context(warm_server(tree))
                    workers.append(stack.enter_context(http_worker(tree)))
            for module in modules:
                try:
                    results[module] = mutate_module(module, MODULES[module], copy, work, cfg, workers)
                except UserError as e:  # the module's tests fail unmutated: the other modules still run
                    print(f"{module}: not mutated: {e}", flush=True)
                    continue
                save(cfg, results, planted)  # a stopped run keeps the modules it finished
    low = [f"{m} {r.score:.0%}" for m, r in results.items() if r.score < 0.85]
    missed = [p.name for p in planted if not p.killed]
    print(f"wrote {cfg.results_dir / 'mutation.json'}")
    if low or missed:
        sys.exit("error: " + "; ".join(filter(None, [f"below 85% detected: {', '.join(low)}" if low else "",
                                                     f"planted defects not caught: {', '.join(missed)}" if missed
                                                     else ""])))


if __name__ == "__main__":
    main()
