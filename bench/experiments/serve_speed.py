"""Serving overhead: one streaming client against generate() on the same model, and many clients against one,
for each way of running decode steps.

    python -m bench.experiments serve_speed                  # GPT-2 124M config, random weights, 128 new tokens,
                                                             # 1 client and 12 clients, traced and dynamic steps
    python -m bench.experiments serve_speed --weights int8   # the int8 artifact (quantize/dynamic.py --head int8)
    python -m bench.experiments serve_speed --model tiny --new-tokens 64 --clients 4 8 16 --decode traced
    python -m bench.experiments serve_speed --decode traced --async-steps off on   # steps launched ahead or not

This process builds the model, saves it as an artifact (fp32, or int8 as `quantize/dynamic.py --head int8`
writes it), loads it back and times `generate()` on it (batch 1, KV cache, prefill included, sampling as the
load test's requests do: temperature 0.8, top-k 200, a seed).  For each --decode mode it starts
`python -m serve --decode MODE` on that artifact, on the same device, and times the load test's streaming
`/generate` requests, the first with the same prompt, settings and seed, all with `ignore_eos` so that each
makes exactly --new-tokens tokens, from a client on loopback: one client alone, then each --clients level
sending that many requests at once (the prompts differ in length, as real clients' do); `generate()` is
timed with the same mode's steps (`sample.py --decode`), and after its warm-up call moves the weights onto huge
pages and waits for that background pass, as the server's warm-up does (its CPU slows the steps beside it).
With several --async-steps, each mode's server is started once per setting (`python -m serve --async-steps`: each
step launched before the step before's tokens are read back, or not), each a side of its own ("traced, async
on"), and the first side is compared with each other one as modes are; `generate()` is timed once per mode.
Everything is timed in interleaved rounds, so load on the machine hits every mode and level alike;
ratios are medians of per-round ratios, including the first mode's speed over each other mode's.  Throughput is new
tokens over the round's wall time (for the clients, from the first request sent to the last stream closed);
latency and time to first token are the client's own, over every request of every round.  The first mode's server
is started twice, and one client of the copy is timed in every round too: how far two processes of the same server
read apart is the noise floor under one client's ratio to `generate()` (runtime/timing.py's `noise_floor`).

    python -m bench.experiments serve_speed --llama-server PATH/llama-server [--weights int8]

With --llama-server, the server is also compared with llama.cpp's own server on the same weights as GGUF (F32,
or Q8_0 beside our int8), at each --peer-clients level: that many streaming OpenAI /v1/completions requests at
once to each (bench/eval/loadtest.py's completion_body: 32-token prompts as token ids, greedy, exactly --new-tokens
tokens), ours from `python -m serve` with its defaults, llama-server with as many slots as clients, as its docs
advise (bench/peers/llama_cpp_peer.py's SERVER_SETUP), in interleaved rounds.  Each round sends new prompts
(English windows of the built-in validation text), so no server answers from a cache of an earlier round's
prompt.
"""
from __future__ import annotations

import asyncio
import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench.experiment import Experiment, RandomWeightsSettings, SettingsError
from bench.eval.loadtest import (PROMPTS, LevelResult, checked, completion_body, exact_request_body, level_name,
                           run_level)
from bench.peers.llama_cpp_peer import check_llama_server
from bench.plots import finish, grouped_bars, plt
from bench.report_page import Page, decode_path, spread, timed_as
from data.tokenizer import encode
from model.config import preset
from decode.generate import generate
from model.gpt import GPT
from model.int8 import quantize_model
from model.packed_linear import pack_for_inference
from decode.sampling import SamplingParams
from runtime.cli import option
from runtime import huge_pages
from runtime.device import choose_device
from runtime.provenance import provenance
from runtime.timing import (Environment, Spread, environment, noise_floor, paired_ratio, ratio_beside_floor,
                            time_interleaved)
from decode.steps import DECODE_MODES
from serve.launch import ServerProcess, running, running_server
from serve.runner import ASYNC_STEPS
from serve.warm_up import HUGE_PAGES_SETTLE_S
from storage.artifact import int8_artifact_writers, load_model, save_artifact
from storage.folder import write_folder_atomically

REQUEST_TIMEOUT_S = 600.0
# The key of the first mode's second server, whose one client in every round measures the noise floor.
TWIN = "twin"


@dataclass
class Settings(RandomWeightsSettings):
    new_tokens: int = option(128, "tokens generated per request", min=1)
    clients: list[int] = option([12], "concurrency levels measured beside one client: that many requests sent at "
                                      "once", min=2)
    repeats: int = option(3, "timed rounds (after one untimed warm-up round)", min=1)
    device: str = option("auto", "auto, cpu, cuda, ... (the server's too)")
    decode: list[str] = option(["traced", "dynamic"], "ways of running decode steps, each in generate() and in a "
                                                   "server of its own; the first is compared with the others",
                               choices=DECODE_MODES)
    weights: str = option("fp32", "the artifact served: fp32, or int8 (int8 linears and head, CPU only)",
                          choices=("fp32", "int8"))
    llama_server: str | None = option(None, "llama.cpp's llama-server binary: compare the server with it on the "
                                            "same weights as GGUF (F32, or Q8_0 with --weights int8)")
    peer_clients: list[int] = option([1, 4, 12], "concurrency levels of the llama-server comparison", min=1)
    async_steps: list[str] = option(["auto"], "the servers' --async-steps: with several, a server of each mode for "
                                             "each, timed side by side", choices=ASYNC_STEPS)
    huge_pages: bool = option(True, "after generate()'s warm-up call, move this process's weights onto huge pages "
                                    "as the server's warm-up does; --no-huge-pages leaves them (a process holding "
                                    "much else, whose whole memory the pass would go through)")

    def __post_init__(self):
        super().__post_init__()
        check_llama_server(self.llama_server, SettingsError)
        if len(set(self.decode)) != len(self.decode):
            raise SettingsError(f"--decode names a mode twice: {' '.join(self.decode)}")
        if len(set(self.async_steps)) != len(self.async_steps):
            raise SettingsError(f"--async-steps names a setting twice: {' '.join(self.async_steps)}")

    @property
    def sides(self) -> list[tuple[str, str, str]]:
        """(name, decode mode, --async-steps) of each server timed, --decode's order first: named by its mode alone
        unless several --async-steps are timed."""
        return [(mode if len(self.async_steps) == 1 else f"{mode}, async {steps}", mode, steps)
                for mode in self.decode for steps in self.async_steps]


@dataclass
class Percentiles:
    p50: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values: list[float]) -> Percentiles:
        return cls(*(float(np.percentile(values, q)) for q in (50, 95, 99)))


@dataclass
class Level:
    clients: int
    tokens_per_s: Spread  # every client's new tokens over the round's wall time
    latency_ms: Percentiles  # per request, over every round
    first_token_ms: Percentiles
    over_one_client: float | None  # throughput against one client alone (None for the one-client level)


@dataclass
class DecodeSpeed:
    decode: str  # how decode steps ran (DECODE_MODES), in generate() and its server; with several --async-steps,
    # the server's setting too ("traced, async on")
    generate_tokens_per_s: Spread
    levels: list[Level]  # one client first
    one_client_over_generate: float  # median of per-round ratios
    # One client of this server over one of a second copy started alike, median of per-round ratios: the noise
    # floor under one_client_over_generate (the first mode's only; None for the others).
    one_client_over_twin: float | None
    # The first mode's speed over this one's, by "generate()" and level ("1 client", "12 clients"); None for
    # the first mode.
    first_over_this: dict[str, float] | None


@dataclass
class PeerLevel:
    clients: int
    ours: Level
    peer: Level
    ours_over_peer: float  # throughput, median of per-round ratios


@dataclass
class PeerComparison:
    peer: str  # llama-server's build and the GGUF format it served
    setup: str
    prompt_tokens: int
    levels: list[PeerLevel]


@dataclass
class ServeSpeed:
    model: str
    weights: str  # fp32 or int8
    prompt: str
    prompt_tokens: int
    new_tokens: int
    decodes: list[DecodeSpeed]  # in --decode's order (each mode's --async-steps in theirs)
    peer: PeerComparison | None  # with --llama-server
    environment: Environment


def measured_level(runs: list[LevelResult], clients: int, new_tokens: int, over_one_client: float | None) -> Level:
    """A level from its rounds, the first (a warm-up) left out: throughput per round over the clients' own clock
    (first request sent to last stream closed), latency and first token over every request."""
    timed = runs[1:]
    outcomes = [o for run in timed for o in run.outcomes]
    return Level(clients, Spread.of([clients * new_tokens / run.wall_s for run in timed]),
                 Percentiles.of([1000 * o.latency_s for o in outcomes]),
                 Percentiles.of([1000 * o.ttft_s for o in outcomes]), over_one_client)


def save_served_artifact(folder: Path, model: GPT, weights: str) -> None:
    """The model as an artifact the server loads: as it is, or quantized as `quantize/dynamic.py --head int8`
    quantizes it."""
    produced_by = provenance("bench/experiments/serve_speed.py")
    if weights == "fp32":
        save_artifact(folder, model, model.config, "float", produced_by)
    else:
        write_folder_atomically(folder, int8_artifact_writers(model, produced_by, quantize_model(model, head="int8")))


def random_artifact(model_name: str, work_dir: Path, weights: str = "fp32") -> Path:
    """The preset `model_name` with weights drawn from seed 0, saved once as an artifact of `weights` (fp32 or
    int8, `save_served_artifact`) in `work_dir` (kept for later runs of the experiment), for the experiments that
    time a server rather than a trained model."""
    work_dir.mkdir(parents=True, exist_ok=True)
    artifact = work_dir / f"{model_name}_{weights}"
    if not artifact.exists():
        torch.manual_seed(0)
        save_served_artifact(artifact, GPT(preset(model_name)).eval(), weights)
    return artifact


def measure(settings: Settings, work_dir: Path) -> ServeSpeed:
    device = choose_device(settings.device)
    if settings.weights == "int8" and device.type != "cpu":
        raise SettingsError(f"--weights int8 runs PyTorch's int8 kernels, which are CPU-only; the device is {device}")
    torch.manual_seed(0)
    prompt = PROMPTS[0]
    prompt_ids = encode(prompt)
    config = preset(settings.model)
    if len(prompt_ids) + settings.new_tokens > config.block_size:
        raise SettingsError(f"--new-tokens {settings.new_tokens} and the prompt exceed the {settings.model} "
                            f"context of {config.block_size}")
    shutil.rmtree(work_dir, ignore_errors=True)  # this experiment's own scratch from last time
    work_dir.mkdir(parents=True)
    artifact = work_dir / "model"
    float_model = GPT(config).eval()
    gguf = None
    if settings.llama_server:
        from bench.peers.llama_cpp_peer import gguf_files
        gguf = gguf_files(float_model, work_dir / "gguf")["F32" if settings.weights == "fp32" else "Q8_0"]
    save_served_artifact(artifact, float_model, settings.weights)
    model, _ = load_model(artifact, device)  # what the server loads
    pack_for_inference(model)  # as the server does

    idx = torch.tensor([prompt_ids], device=device)
    first = exact_request_body(0, settings.new_tokens)
    params = SamplingParams(max_new_tokens=settings.new_tokens, temperature=first["temperature"],
                            top_k=first["top_k"], seed=first["seed"], stop_at_eot=False)
    counts = [1, *settings.clients]
    sides = settings.sides
    levels: dict[tuple[str, int | str], list[LevelResult]] = {(side, n): [] for side, _, _ in sides for n in counts}
    first = sides[0][0]
    levels[first, TWIN] = []
    server_args = ["--device", str(device), "--max-batch-size", str(max(16, *settings.clients)),
                   "--max-connections", str(max(128, 2 * max(settings.clients))),
                   "--request-timeout-s", str(REQUEST_TIMEOUT_S)]

    def clients(url: str, key: tuple[str, int | str], n: int):
        def call():
            levels[key].append(checked(asyncio.run(run_level(url, n, n, settings.new_tokens, REQUEST_TIMEOUT_S,
                                                             REQUEST_TIMEOUT_S, body=exact_request_body)),
                                       settings.new_tokens))
        return call

    def generating(mode: str):
        warmed = False

        def call():
            nonlocal warmed
            generate(model, idx, params, decode=mode)
            if not warmed and settings.huge_pages and device.type == "cpu":  # the warm-up: as the server's warm-up
                huge_pages.collapse_in_background()  # does, move the weights onto huge pages and wait for the pass,
                huge_pages.settled(HUGE_PAGES_SETTLE_S)  # which takes CPU from the steps beside it
            warmed = True
        return call

    with contextlib.ExitStack() as servers:
        calls = {}
        for side, mode, steps in sides:
            arguments = [*server_args, "--decode", mode, "--async-steps", steps]
            server = servers.enter_context(running_server(artifact, work_dir / f"server_{mode}_{steps}.log",
                                                          arguments))
            calls.setdefault((mode, "generate"), generating(mode))
            calls.update({(side, n): clients(server.url, (side, n), n) for n in counts})
            if side == first:
                first_arguments = arguments
        twin = servers.enter_context(running_server(artifact, work_dir / "server_first_twin.log", first_arguments))
        calls[first, TWIN] = clients(twin.url, (first, TWIN), 1)
        seconds = time_interleaved(calls, settings.repeats, warmup=1, device=device, progress="serve_speed rounds")
    # The clients' own clock: from the first request sent to the last stream closed; the first round warmed up.
    wall = {key: [run.wall_s for run in runs[1:]] for key, runs in levels.items()}
    decodes = []
    first_mode = sides[0][1]
    for side, mode, _ in sides:
        result_levels = [measured_level(levels[side, n], n, settings.new_tokens,
                                        None if n == 1 else paired_ratio(wall[side, 1], [s / n for s in wall[side, n]]))
                         for n in counts]
        first_over_this = None
        if side != first:
            first_over_this = {"generate()": paired_ratio(seconds[mode, "generate"], seconds[first_mode, "generate"]),
                               **{level_name(n): paired_ratio(wall[side, n], wall[first, n]) for n in counts}}
        decodes.append(DecodeSpeed(side, Spread.of([settings.new_tokens / s for s in seconds[mode, "generate"]]),
                                   result_levels, paired_ratio(seconds[mode, "generate"], wall[side, 1]),
                                   paired_ratio(wall[first, TWIN], wall[first, 1]) if side == first else None,
                                   first_over_this))
    for d in decodes:
        print(f"{d.decode}: generate() {d.generate_tokens_per_s.median:.1f} new tokens/s; one streaming client "
              f"{d.levels[0].tokens_per_s.median:.1f} ({d.one_client_over_generate:.2f}x generate()"
              + ("" if d.one_client_over_twin is None else f"; {d.one_client_over_twin:.2f}x its twin server")
              + ")"
              + "".join(f"; {lv.clients} clients {lv.tokens_per_s.median:.1f} ({lv.over_one_client:.2f}x one)"
                        for lv in d.levels[1:])
              + ("" if d.first_over_this is None else "; " + first + " over " + d.decode + ": "
                 + ", ".join(f"{k} {v:.2f}x" for k, v in d.first_over_this.items())))
    peer = None if gguf is None else against_llama_server(settings, artifact, gguf, work_dir, device)
    return ServeSpeed(settings.model, settings.weights, prompt, len(prompt_ids), settings.new_tokens, decodes, peer,
                      environment(device))


PEER_PROMPT_TOKENS = 32


def against_llama_server(settings: Settings, artifact: Path, gguf: Path, work_dir: Path,
                         device: torch.device) -> PeerComparison:
    """Our server and llama-server on the same weights, each --peer-clients level in interleaved rounds."""
    from bench.experiments.generate_speed import real_prompts
    from bench.peers.llama_cpp_peer import SERVER_SETUP, llama_server_command, llama_server_version
    binary = Path(settings.llama_server)
    threads = torch.get_num_threads()
    context = PEER_PROMPT_TOKENS + settings.new_tokens
    most = max(settings.peer_clients)
    prompts = real_prompts((settings.repeats + 1) * most, PEER_PROMPT_TOKENS).tolist()
    counts = settings.peer_clients
    runs: dict[tuple[str, int], list[LevelResult]] = {(side, n): [] for side in ("ours", "peer") for n in counts}

    def clients(url: str, side: str, n: int):
        def call():
            offset = len(runs[side, n]) * most  # a new round, new prompts
            body = lambda i, new: completion_body(artifact.name, prompts[offset + i], new)  # llama-server takes any
            runs[side, n].append(checked(asyncio.run(run_level(url, n, n, settings.new_tokens, REQUEST_TIMEOUT_S,
                                                               REQUEST_TIMEOUT_S, body=body, route="/v1/completions")),
                                         settings.new_tokens))
        return call

    with contextlib.ExitStack() as servers:
        ours = servers.enter_context(running_server(artifact, work_dir / "server_peer_ours.log", [
            "--device", str(device), "--max-batch-size", str(max(16, most)),
            "--request-timeout-s", str(REQUEST_TIMEOUT_S)]))
        calls = {}
        for n in counts:
            peer = servers.enter_context(running(ServerProcess.start(
                llama_server_command(binary, gguf, n, context, threads), work_dir / f"llama_server_{n}.log")))
            calls["ours", n] = clients(ours.url, "ours", n)
            calls["peer", n] = clients(peer.url, "peer", n)
        time_interleaved(calls, settings.repeats, warmup=1, device=device, alternate=True,
                         progress="llama-server rounds")
    wall = {key: [run.wall_s for run in r[1:]] for key, r in runs.items()}
    level = lambda side, n: measured_level(runs[side, n], n, settings.new_tokens, None)
    levels = [PeerLevel(n, level("ours", n), level("peer", n), paired_ratio(wall["peer", n], wall["ours", n]))
              for n in counts]
    for lv in levels:
        print(f"{level_name(lv.clients)}: ours {lv.ours.tokens_per_s.median:.1f} new tokens/s (first token "
              f"{lv.ours.first_token_ms.p50:.0f} ms), llama-server {lv.peer.tokens_per_s.median:.1f} "
              f"({lv.peer.first_token_ms.p50:.0f} ms): {lv.ours_over_peer:.2f}x", flush=True)
    name = f"llama-server {llama_server_version(binary)}, {'F32' if settings.weights == 'fp32' else 'Q8_0'}"
    return PeerComparison(name, SERVER_SETUP, PEER_PROMPT_TOKENS, levels)


def plot(result: ServeSpeed):
    fig, axes = plt.subplots(1, 2 if result.peer else 1, figsize=(14 if result.peer else 7, 3.8), squeeze=False)
    ax = axes[0][0]
    grouped_bars(ax, ["generate()", *[level_name(lv.clients) for lv in result.decodes[0].levels]],
                 {f"{d.decode} decode steps": [d.generate_tokens_per_s, *[lv.tokens_per_s for lv in d.levels]]
                  for d in result.decodes})
    ax.set_ylabel("new tokens / s (min-max)")
    ax.set_title(f"{result.model} {result.weights}: {result.new_tokens} new tokens per request, sampled, streamed")
    if result.peer:
        plot_peer(axes[0][1], result)
    return finish(fig, axes[0], grid="y", legend=True)


def plot_peer(ax, result: ServeSpeed) -> None:
    levels = result.peer.levels
    sides = {f"ours ({result.weights})": [lv.ours for lv in levels], result.peer.peer: [lv.peer for lv in levels]}
    drawn = grouped_bars(ax, [level_name(lv.clients) for lv in levels],
                         {name: [side.tokens_per_s for side in measured] for name, measured in sides.items()})
    for name, bars in drawn.items():
        ax.bar_label(bars, labels=[f"{side.tokens_per_s.median:.0f}\n{side.first_token_ms.p50:.0f} ms"
                                   for side in sides[name]], fontsize=7)
    ax.set_ylabel("new tokens / s (min-max); first token p50")
    ax.set_title(f"against llama-server: {result.peer.prompt_tokens}-token prompts, greedy, /v1/completions")


def section(res: ServeSpeed, page: Page) -> None:
    page.add(f"`{res.model}` with random weights, {res.weights}, prompt \"{res.prompt}\" ({res.prompt_tokens} "
             f"tokens), {res.new_tokens} new tokens per request, sampled (temperature 0.8, top-k 200); `generate()` "
             f"in the benchmark's process against streaming `/generate` requests to `python -m serve` on the same "
             f"artifact and device, each with the same decode steps, all timed in interleaved rounds.\n")
    page.add(timed_as("the decode mode in each row (`--decode`; the path timed column), the same in `generate()` and "
                      "its server", "not overlapped: each server started, and made its start-up warm-up, alone, after "
                      "the one before it answered /health; `generate()` warmed up in this process; the first round "
                      "of every row is untimed"))
    # A side's name is its decode mode, then its server's --async-steps where several were timed ("traced, async on")
    path = lambda d: ", ".join([decode_path(d.decode.split(", ")[0]), *d.decode.split(", ")[1:]])
    rows = []
    for d in res.decodes:
        rows.append([f"`generate()`, batch 1, {d.decode}", path(d), spread(d.generate_tokens_per_s),
                     "", "", ""])
        for lv in d.levels:
            over = (f"{d.one_client_over_generate:.2f}x `generate()`" if lv.over_one_client is None
                    else f"{lv.over_one_client:.2f}x one client")
            rows.append([f"{lv.clients} streaming client{'s' if lv.clients > 1 else ''}, {d.decode}",
                         path(d), spread(lv.tokens_per_s), over,
                         " / ".join(f"{v:.0f}" for v in (lv.latency_ms.p50, lv.latency_ms.p95, lv.latency_ms.p99)),
                         " / ".join(f"{v:.0f}" for v in (lv.first_token_ms.p50, lv.first_token_ms.p95,
                                                         lv.first_token_ms.p99))])
    page.table(["", "path timed", "new tokens/s (min-max)", "ratio", "latency p50 / p95 / p99 ms",
                "first token p50 / p95 / p99 ms"], rows)
    first = res.decodes[0]
    floor = noise_floor(first.one_client_over_twin)
    page.add(f"**One streaming client against `generate()`, {first.decode} steps: "
             f"{ratio_beside_floor(first.one_client_over_generate, floor)}**, where the gap is the server's "
             f"per-token cost (HTTP, event stream, the engine's batching bookkeeping) over the bare decoding loop. "
             f"The floor: one client of this server against one of a second copy started alike, timed in the same "
             f"rounds, read {first.one_client_over_twin:.2f}x.\n")
    for d in res.decodes[1:]:
        page.add(f"{first.decode} steps over {d.decode} steps, paired in the same rounds: "
                 + ", ".join(f"{k} {v:.2f}x" for k, v in d.first_over_this.items()) + ".\n")
    if res.peer:
        peer = res.peer
        page.add(f"Against {peer.peer} on the same weights ({peer.setup}); {peer.prompt_tokens}-token prompts, "
                 f"{res.new_tokens} greedy new tokens each, new prompts every round.\n")
        page.add(timed_as(f"ours: `python -m serve` with its defaults, {decode_path('auto')}; {peer.peer}: its own",
                          "not overlapped: each server started alone, after the one before it answered /health; "
                          "the first round is untimed"))
        ms = lambda p: f"{p.p50:.0f} / {p.p99:.0f}"
        page.table(["clients", "ours new tokens/s", "llama-server", "ours / llama-server", "first token p50 / p99 ms, "
                    "ours", "llama-server", "latency p50 / p99 ms, ours", "llama-server"],
                   [[lv.clients, spread(lv.ours.tokens_per_s), spread(lv.peer.tokens_per_s), f"{lv.ours_over_peer:.2f}x",
                     ms(lv.ours.first_token_ms), ms(lv.peer.first_token_ms), ms(lv.ours.latency_ms),
                     ms(lv.peer.latency_ms)] for lv in peer.levels])


EXPERIMENT = Experiment(
    name="serve_speed", title="Serving against generate()", about=__doc__, settings=Settings,
    quick=Settings(new_tokens=64, repeats=2), full=Settings(),
    result=ServeSpeed, measure=measure, plot=plot, section=section,
    # On a GPU, auto's captured CUDA graphs against eager steps (the traced steps are the CPU's).
    gpu=Settings(clients=[12, 32], repeats=5, decode=["cuda-graph", "dynamic"]))
