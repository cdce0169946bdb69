"""Fault drills: what a reader, a kill -9, a poisoned request, slow clients and a dead rank cost.

    python -m bench.experiments faults            # quick: 2 minutes on 2 CPU cores, loopback only
    python -m bench.experiments faults --kills 10 --rank-kills 3 --slow-clients 100   # more trials

Each drill runs the real tools in their own processes and counts trials, failures and work lost:
- readers during saves: train.py saves every step while other processes load the checkpoint in a tight
  loop (config, weights and training state read as one save); a failure is a read that errs or mixes two
  saves, or a training run that does not finish.
- kill -9 during saves: train.py, saving every step, is killed at a random moment up to 0.1 s after a save
  begins, then resumed to the end; a failure is a resume that errs or a final loss that differs from an
  uninterrupted run's.  Work lost: the steps trained after the last checkpoint.
- poison request: a request with temperature 7.3e-39 (its scaled logits overflow) is batched with greedy
  ones; a failure is any greedy answer that differs from its answer alone, or a 500 or internal text.
- slow clients: connections trickle headers one byte at a time while /health is probed; a failure is a
  probe slower than 1 s, or a trickler still connected 3 s after the read deadline.
- killed rank: one rank of a 2-rank DDP job (a checkpoint every 5 steps) is killed with SIGKILL at a random
  moment after its first checkpoint; a failure is a job that does not end within the collective timeout plus
  60 s with an error.  Work lost: steps after the last checkpoint.
- rank killed under --max-restarts: the same kill under `torchrun --max-restarts=1` with `--resume auto`; a
  failure is a job that does not exit 0 or ends with another loss than an uninterrupted run.  Work lost:
  the steps trained again after the restart.
- disk full during a save: train.py on a tmpfs with room for one checkpoint, not two (needs root to mount);
  a failure is anything but one `error:` line naming ENOSPC and the last good checkpoint, which must load.
- hostile .contents or journal: a folder whose `.contents` (given to quantize --overwrite) or save journal
  (given to sample.py, a reader) names a place outside it; a failure is a file outside moved or deleted,
  or anything but one `error:` line naming the entry.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from bench.experiment import Experiment, ExperimentError, SettingsError
from bench.record import plt
from bench.report_page import Page
from model.config import GPTConfig
from model.gpt import GPT
from runtime.cli import check_options, non_default_flags, option
from runtime.provenance import provenance
from runtime.timing import Environment, environment
from serve.launch import LOOPBACK, running_server
from storage.artifact import load_model, save_artifact
from storage.folder import STAGING_DIR
from storage.training_state import TrainingState
from storage.weights import ArtifactError
from training.config import TrainConfig

# A reader in its own process: load the checkpoint (config, weights, training state as one save) until
# the stop file appears; print the number of reads and the first errors as JSON.
READER = textwrap.dedent("""
    import json, pathlib, sys
    from storage.artifact import load_model
    from storage.folder import reading
    from storage.training_state import TrainingState
    from storage.weights import ArtifactError
    folder, stop = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    reads, errors = 0, []
    while not stop.exists():
        try:
            with reading(folder):
                model, meta = load_model(folder)
                state = TrainingState.read(folder)
            if state.step != meta.step:
                errors.append(f"config.json of step {meta.step} beside state.json of step {state.step}")
            reads += 1
        except ArtifactError as e:  # before the first save there is nothing to read
            if reads or "has no config.json" not in str(e) and "does not exist" not in str(e):
                errors.append(str(e))
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
    print(json.dumps({"reads": reads, "errors": errors[:5]}))
""")

# The drills' training run; each drill changes its steps, checkpoints and folder.
DRILL_RUN = TrainConfig(model="tiny", dataset="builtin", device="cpu", batch_size=4, block_size=64, log_interval=1,
                        eval_interval=1000, final_eval_batches=2, warmup_steps=5, lr=2e-3)


def train_argv(**changes) -> list[str]:
    """train.py and its flags for the drills' run with `changes` (typed: a misspelt setting fails here)."""
    return ["train.py", *non_default_flags(dataclasses.replace(DRILL_RUN, **changes))]


def train_command(**changes) -> list[str]:
    return [sys.executable, *train_argv(**changes)]


@dataclass
class Settings:
    reader_steps: int = option(12, "steps of the run read during saves (one save a step)", min=1)
    readers: int = option(2, "reader processes beside that run", min=1)
    kills: int = option(3, "kill -9 drills", min=1)
    kill_steps: int = option(12, "steps of each killed-and-resumed run", min=8)
    poison_batches: int = option(3, "batches with a poison request", min=1)
    greedy_per_batch: int = option(3, "greedy requests batched with each poison one", min=1)
    slow_clients: int = option(20, "connections trickling their headers", min=1)
    read_timeout_s: float = option(2.0, "the server's --read-timeout-s in that drill")
    rank_kills: int = option(1, "2-rank DDP jobs whose second rank is killed (each drill: "
                                "job ends, job restarts)", min=1)
    dist_timeout_s: float = option(20.0, "those jobs' --dist-timeout-s")
    disk_full_runs: int = option(1, "training runs that fill a small tmpfs")
    seed: int = option(0, "seed of the kill moments")

    def __post_init__(self):
        check_options(self, SettingsError)


@dataclass
class Drill:
    name: str
    trials: int
    failures: int
    work_lost: str  # in the drill's own unit, or "-" where nothing can be lost
    seconds: float
    notes: list[str]


@dataclass
class Faults:
    drills: list[Drill]
    environment: Environment


def run_quietly(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, **kwargs)


def last_error_line(text: str) -> str:
    """The line that says what went wrong: the tool's own `error:` line, else torchrun's exit summary."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for marker in ("error:", "exitcode", "Signal") for line in reversed(lines) if marker in line),
                lines[-1] if lines else "")[:200]


def steps(n: int) -> str:
    return f"{n} step{'' if n == 1 else 's'}"


def logged_losses(folder: Path) -> dict[int, float]:
    path = folder / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def saved_step(folder: Path) -> int:
    try:
        state = TrainingState.read(folder)
        return state.step if state else 0
    except ArtifactError:  # read while the first save was being written
        return 0


def readers_during_saves(s: Settings, work: Path) -> Drill:
    out, stop = work / "readers", work / "readers.stop"
    started = time.perf_counter()
    readers = [subprocess.Popen([sys.executable, "-c", READER, str(out), str(stop)], stdout=subprocess.PIPE,
                                text=True) for _ in range(s.readers)]
    training = run_quietly(train_command(max_steps=s.reader_steps, checkpoint_interval=1, out_dir=str(out)))
    stop.touch()
    reports = [json.loads(r.communicate(timeout=120)[0]) for r in readers]
    errors = [e for r in reports for e in r["errors"]]
    notes = errors[:3]
    if training.returncode:
        notes.append(f"training failed: {last_error_line(training.stderr)}")
    lost = s.reader_steps - saved_step(out)
    return Drill("readers during saves", sum(r["reads"] for r in reports), len(errors) + (training.returncode != 0),
                 steps(lost), time.perf_counter() - started, notes)


def kill_during_saves(s: Settings, work: Path) -> Drill:
    started, rng = time.perf_counter(), random.Random(s.seed)
    reference = work / "kill-reference"
    run_quietly(train_command(max_steps=s.kill_steps, checkpoint_interval=1000, out_dir=str(reference)), check=True)
    expected = logged_losses(reference)[s.kill_steps]
    failures, lost, notes, inside_a_save = 0, [], [], 0
    for trial in range(s.kills):
        out = work / f"kill-{trial}"
        process = subprocess.Popen(train_command(max_steps=s.kill_steps, checkpoint_interval=1, out_dir=str(out)),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while saved_step(out) < 2 and process.poll() is None:
            time.sleep(0.02)
        while not (out / STAGING_DIR).exists() and process.poll() is None:  # the next save begins
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.1))  # staging and moving a save of the tiny model takes about 0.1 s here
        process.send_signal(signal.SIGKILL)
        process.wait()
        inside_a_save += (out / STAGING_DIR).exists()
        trained = max(logged_losses(out), default=0)
        resumed = run_quietly(train_command(max_steps=s.kill_steps, checkpoint_interval=1, out_dir=str(out),
                                            resume="yes"))
        resumed_at = next((int(w) for line in resumed.stdout.splitlines() if line.startswith("resumed")
                           for w in line.split()[-1:] if w.isdigit()), None)
        got = logged_losses(out).get(s.kill_steps)
        if resumed.returncode or got is None or abs(got - expected) > 1e-6 * abs(expected):
            failures += 1
            notes.append(f"trial {trial}: resume exit {resumed.returncode}, loss {got} vs {expected}: "
                         f"{last_error_line(resumed.stderr)}")
        if resumed_at is not None:
            lost.append(max(0, trained - resumed_at))
    notes.append(f"{inside_a_save} of {s.kills} kills landed while a save was being staged or moved")
    return Drill("kill -9 during saves, then resume", s.kills, failures,
                 f"{steps(sum(lost))} in all (at most {max(lost, default=0)} per kill)",
                 time.perf_counter() - started, notes)


def small_artifact(folder: Path) -> Path:
    """The served model of the server drills, saved by the first drill that needs it."""
    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=128))
        save_artifact(folder, model, model.config, "float", provenance("bench/experiments/faults.py"))
    return folder


def poison_request(s: Settings, work: Path) -> Drill:
    started = time.perf_counter()
    failures, notes = 0, []
    greedy = [{"prompt": f"drill {i}", "max_new_tokens": 24, "temperature": 0} for i in range(s.greedy_per_batch)]
    poisons = [{"prompt": "poison", "max_new_tokens": 24, "temperature": 7.3e-39},
               {"prompt": "poison", "max_new_tokens": 24, "top_p": 1e-300, "temperature": 1.0},
               {"prompt": "poison", "max_new_tokens": 24, "temperature": 5e-324}]
    with running_server(small_artifact(work / "serve-model"), work / "poison-server.log") as server:
        post = lambda body: httpx.post(f"{server.url}/generate", json=body, timeout=60)
        alone = [post(body).json()["text"] for body in greedy]
        for trial in range(s.poison_batches):
            poison = poisons[trial % len(poisons)]
            with ThreadPoolExecutor(len(greedy) + 1) as pool:
                replies = list(pool.map(post, [poison, *greedy]))
            together = [r.json().get("text") if r.status_code == 200 else None for r in replies[1:]]
            leaked = replies[0].status_code >= 500 or any(w in replies[0].text for w in ("Traceback", "KeyError"))
            if together != alone or leaked:
                failures += 1
                notes.append(f"trial {trial}: poison answered {replies[0].status_code} {replies[0].text[:120]}; "
                             f"greedy rows equal to alone: {together == alone}")
    return Drill("poison request in a greedy batch", s.poison_batches, failures, "-",
                 time.perf_counter() - started, notes)


def slow_clients(s: Settings, work: Path) -> Drill:
    started = time.perf_counter()
    probes, slow_probes, notes = 0, 0, []
    args = ["--read-timeout-s", str(s.read_timeout_s), "--max-connections", str(s.slow_clients + 16)]
    with running_server(small_artifact(work / "serve-model"), work / "slow-server.log", args) as server:
        tricklers = [socket.create_connection((LOOPBACK, server.port), timeout=5) for _ in range(s.slow_clients)]
        open_ones = set(range(len(tricklers)))
        for t in tricklers:
            t.setblocking(False)
            t.sendall(b"POST /generate HTTP/1.1\r\n")
        deadline = time.monotonic() + s.read_timeout_s + 3
        while open_ones and time.monotonic() < deadline:
            for i in list(open_ones):
                try:
                    if tricklers[i].recv(4096) == b"":
                        open_ones.discard(i)
                        continue
                    open_ones.discard(i)  # answered (408): stop sending
                except BlockingIOError:
                    try:
                        tricklers[i].sendall(b"x")
                    except OSError:
                        open_ones.discard(i)
                except OSError:
                    open_ones.discard(i)
            sent = time.monotonic()
            try:
                ok = httpx.get(f"{server.url}/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                ok = False
            probes += 1
            slow_probes += (not ok) or time.monotonic() - sent > 1.0
            time.sleep(0.25)
        for t in tricklers:
            t.close()
    if open_ones:
        notes.append(f"{len(open_ones)} slow clients still connected {s.read_timeout_s + 3:g} s after connecting")
    if slow_probes:
        notes.append(f"{slow_probes} of {probes} /health probes failed or took over 1 s")
    return Drill(f"{s.slow_clients} slow clients vs /health", probes, slow_probes + len(open_ones), "-",
                 time.perf_counter() - started, notes)


def worker_pids(parent: int) -> dict[int, int]:
    """LOCAL_RANK -> pid of torchrun's worker processes (read from /proc)."""
    workers = {}
    for task in Path(f"/proc/{parent}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            rank = next((int(v.split(b"=")[1]) for v in env if v.startswith(b"LOCAL_RANK=")), None)
            if rank is not None:
                workers[rank] = int(child)
    return workers


def killed_rank(s: Settings, work: Path) -> Drill:
    if not Path("/proc/self/task").exists():
        raise ExperimentError("the killed-rank drill finds torchrun's workers through /proc (Linux)")
    started, rng = time.perf_counter(), random.Random(s.seed)
    failures, lost, notes = 0, [], []
    for trial in range(s.rank_kills):
        out = work / f"rank-{trial}"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                   *train_argv(parallel="ddp", max_steps=500, checkpoint_interval=5, dist_timeout_s=s.dist_timeout_s,
                               out_dir=str(out))]
        job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
        while saved_step(out) < 5 and job.poll() is None:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.2, 2.0))  # somewhere in the next checkpoint interval (5 steps)
        victim = worker_pids(job.pid).get(1)
        if victim is None:
            job.kill()
            raise ExperimentError(f"torchrun's rank 1 was not found: {job.stderr.read()[-300:]}")
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        try:
            _, stderr = job.communicate(timeout=s.dist_timeout_s + 60)
            ended_s = time.monotonic() - killed_at
        except subprocess.TimeoutExpired:
            job.kill()
            stderr, ended_s = job.communicate()[1], None
        trained = max(logged_losses(out), default=0)
        lost.append(max(0, trained - saved_step(out)))
        if ended_s is None or job.returncode == 0:
            failures += 1
            notes.append(f"trial {trial}: the job {'did not end' if ended_s is None else 'exited 0'}")
        else:
            notes.append(f"trial {trial}: ended {ended_s:.1f} s after the kill, exit {job.returncode}: "
                         f"{last_error_line(stderr)}")
    return Drill("one rank of 2 killed (DDP, gloo)", s.rank_kills, failures,
                 f"{steps(sum(lost))} in all", time.perf_counter() - started, notes)


def restarted_rank(s: Settings, work: Path) -> Drill:
    """As `killed_rank`, under `torchrun --max-restarts=1` with `--resume auto`: torchrun restarts both ranks,
    which continue from the last checkpoint.  A failure is a job that does not exit 0 or whose final loss
    differs from an uninterrupted run's."""
    started, rng = time.perf_counter(), random.Random(s.seed + 1)
    steps_in_run = 30

    def job(out: Path, *launcher: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                                 *launcher, *train_argv(parallel="ddp", max_steps=steps_in_run, checkpoint_interval=5,
                                                        resume="auto", out_dir=str(out))],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    reference = work / "restart-reference"
    if job(reference).wait() != 0:
        raise ExperimentError("the uninterrupted 2-rank run of the restart drill failed")
    expected = logged_losses(reference)[steps_in_run]
    failures, lost, notes = 0, [], []
    for trial in range(s.rank_kills):
        out = work / f"restart-{trial}"
        running = job(out, "--max-restarts=1")
        while saved_step(out) < 5 and running.poll() is None:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.2, 2.0))  # somewhere in the next checkpoint interval
        trained = max(logged_losses(out), default=0)
        victim = worker_pids(running.pid).get(1)
        if victim is None:
            running.kill()
            raise ExperimentError(f"torchrun's rank 1 was not found: {running.communicate()[1][-300:]}")
        os.kill(victim, signal.SIGKILL)
        stdout, stderr = running.communicate(timeout=300)
        resumed_at = next((int(line.split()[-1]) for line in stdout.splitlines() if line.startswith("resumed")), None)
        got = logged_losses(out).get(steps_in_run)
        if resumed_at is not None:
            lost.append(max(0, trained - resumed_at))
        if running.returncode or resumed_at is None or got != expected:
            failures += 1
            notes.append(f"trial {trial}: exit {running.returncode}, resumed at {resumed_at}, final loss {got} vs "
                         f"{expected}: {last_error_line(stderr)}")
        else:
            notes.append(f"trial {trial}: killed near step {trained}, restarted from step {resumed_at}, final loss "
                         f"equal to the uninterrupted run's")
    return Drill("rank killed under --max-restarts: recovered", s.rank_kills, failures,
                 f"{steps(sum(lost))} in all (at most {max(lost, default=0)} per kill)", time.perf_counter() - started,
                 notes)


def disk_full_during_a_save(s: Settings, work: Path) -> Drill:
    """train.py on a tmpfs that holds one checkpoint but not a second: the run must stop with one error line
    naming ENOSPC and the last good checkpoint, which must still load.  Mounting needs root (Linux)."""
    started = time.perf_counter()
    disk = work / "full-disk"
    disk.mkdir()
    # The tiny model's checkpoint is ~87 MB (weights and Adam moments); staging a second needs twice that.
    mounted = run_quietly(["mount", "-t", "tmpfs", "-o", "size=150m", "tmpfs", str(disk)])
    if mounted.returncode:
        return Drill("disk full during a save", 0, 0, "-", time.perf_counter() - started,
                     [f"not run: mounting a small tmpfs failed ({last_error_line(mounted.stderr)}); needs root"])
    failures, notes = 0, []
    try:
        for trial in range(s.disk_full_runs):
            out = disk / f"run-{trial}"
            run = run_quietly(train_command(max_steps=4, checkpoint_interval=2, out_dir=str(out)))
            error = next((line for line in run.stderr.splitlines() if line.startswith("error:")), "no error line")
            try:
                intact = saved_step(out) == 2 and load_model(out)[1].step == 2
            except Exception as e:
                intact, error = False, f"{error}; the checkpoint does not load: {e}"
            ok = (run.returncode == 1 and "Traceback" not in run.stderr and "(ENOSPC)" in error
                  and "checkpoint of step 2" in error and intact)
            failures += not ok
            notes.append(f"trial {trial}: exit {run.returncode}, {'intact' if intact else 'NOT intact'}: {error}")
            shutil.rmtree(out, ignore_errors=True)
    finally:
        run_quietly(["umount", str(disk)])
    return Drill("disk full during a save", s.disk_full_runs, failures, "-", time.perf_counter() - started,
                 notes[:2])


def hostile_contents(s: Settings, work: Path) -> Drill:
    """Folders whose `.contents` or save journal name places outside them (`..`, absolute, through a
    symlink), given to a writer (quantize --overwrite) and a reader (sample.py): a failure is anything moved
    or deleted outside the folder, or an answer other than one `error:` line naming the entry."""
    started = time.perf_counter()
    source = small_artifact(work / "serve-model")
    work = work.resolve()  # the absolute entry must be absolute, and the symlink must point out of the folder
    failures, trials, notes = 0, 0, []
    for which, entry in enumerate(("../victim", str(work / "hostile" / "victim"), "link/precious.txt")):
        for tool in ("quantize --overwrite", "sample.py"):
            root = work / "hostile"
            shutil.rmtree(root, ignore_errors=True)
            (root / "victim").mkdir(parents=True)
            (root / "victim" / "precious.txt").write_text("keep")
            folder = root / "ck"
            shutil.copytree(source, folder, ignore=shutil.ignore_patterns(".*"))
            (folder / "link").symlink_to(root / "victim")
            if tool == "sample.py":
                (folder / STAGING_DIR).mkdir()
                (folder / STAGING_DIR / "COMPLETE").write_text(json.dumps(["config.json", entry]))
                command = [sys.executable, "sample.py", "--checkpoint", str(folder), "--prompt", "x",
                           "--max-new-tokens", "1"]
            else:
                (folder / ".contents").write_text(json.dumps(["config.json", entry]))
                command = [sys.executable, "quantize/dynamic.py", "--checkpoint", str(source), "--out-dir",
                           str(folder), "--overwrite", "--eval-batches", "1", "--repeats", "1", "--new-tokens", "1"]
            run = run_quietly(command)
            error = last_error_line(run.stderr)
            ok = (run.returncode == 1 and (root / "victim" / "precious.txt").exists()
                  and f"lists {entry!r}, which is not a file inside" in error and "Traceback" not in run.stderr)
            trials += 1
            failures += not ok
            if not ok or which == 0:
                notes.append(f"{tool}, entry {entry!r}: exit {run.returncode}: {error}")
    return Drill("hostile .contents or journal", trials, failures, "-", time.perf_counter() - started, notes)


DRILLS = (readers_during_saves, kill_during_saves, poison_request, slow_clients, killed_rank, restarted_rank,
          disk_full_during_a_save, hostile_contents)


def measure(settings: Settings, work_dir: Path) -> Faults:
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    drills = []
    for drill in DRILLS:
        result = drill(settings, work_dir)
        print(f"{result.name:40} {result.trials:6} trials {result.failures:4} failures   work lost "
              f"{result.work_lost:>12}   {result.seconds:6.1f} s")
        drills.append(result)
    return Faults(drills, environment(torch.device("cpu")))


def plot(result: Faults):
    names = [d.name for d in result.drills]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(names) + 1.2))
    ax.barh(names, [d.trials for d in result.drills], color="tab:green", label="trials")
    ax.barh(names, [d.failures for d in result.drills], color="tab:red", label="failures")
    ax.set_xscale("symlog")
    ax.invert_yaxis()
    ax.legend()
    ax.set_title("fault drills")
    return fig


def section(res: Faults, page: Page) -> None:
    page.table(["drill", "trials", "failures", "work lost", "seconds"],
               [[d.name, str(d.trials), str(d.failures), d.work_lost, f"{d.seconds:.0f}"] for d in res.drills])
    notes = [f"- {d.name}: {note}" for d in res.drills for note in d.notes]
    if notes:
        page.add("\n".join(notes) + "\n")


EXPERIMENT = Experiment(
    name="faults", title="Fault drills", about=__doc__, settings=Settings,
    quick=Settings(), full=Settings(reader_steps=40, readers=3, kills=10, kill_steps=20, poison_batches=10,
                                    slow_clients=100, rank_kills=3),
    result=Faults, measure=measure, plot=plot, section=section)
