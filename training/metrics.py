"""What a run measures and how it is recorded: one set of phase names, a phase clock, MFU against a
table of device peaks, and the typed records written one JSON object per line to `metrics.jsonl`."""
from __future__ import annotations

import contextlib
import json
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from model.config import GPTConfig
from runtime.device import peak_memory_bytes, synchronize
from runtime.errors import UserError
from training.curves import CURVES_FILE, METRICS_FILE, plot_runs
from runtime.parsed import Unparsable, json_value

TENSORBOARD_DIR = "tb"
# Every phase of a training step, in the order they happen; train.py, the pruning fine-tunes and the
# benchmarks all use these names.
PHASES = ("data", "forward", "backward", "optimizer", "evaluation", "other")

# Dense bf16 matmul peaks per device (FLOP/s) for MFU, from the vendors' data sheets; matched against
# torch.cuda.get_device_name, most specific first.  Pass --peak-flops for anything else.
PEAK_FLOPS = (("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12), ("L4", 121e12),
              ("A10", 125e12), ("4090", 165e12))


class PhaseClock:
    """Seconds per phase.  The device is synchronised at each boundary so that asynchronous CUDA work
    is charged to the phase that queued it; that costs throughput on a GPU, so the trainer times only
    the last step of each log window."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str):
        synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.device)
            self.seconds[phase] += time.perf_counter() - start

    def reset(self) -> None:
        self.seconds.clear()


class NoClock:
    """What the step is given when nobody times its phases: no synchronisation, no cost."""

    def __call__(self, phase: str):
        return contextlib.nullcontext()


NO_CLOCK = NoClock()


def flops_per_token(config: GPTConfig, n_params: int, block: int) -> float:
    """Training FLOPs per token: 6N for the weights plus the attention scores (PaLM appendix B)."""
    return 6 * n_params + 12 * config.n_layer * config.n_embd * block


def device_peak_flops(device: torch.device, override: float | None = None) -> float | None:
    """One device's peak, from --peak-flops or the table; None where unknown (the CPU)."""
    if override:
        return override
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((peak for key, peak in PEAK_FLOPS if key in name), None)
    return None


@dataclass
class ParallelRecord:
    """Communication and memory of a log window, per step (rank 0's view; memory from every rank)."""
    comm_s: float
    exposed_comm_s: float
    compute_s: float
    comm_share: float
    comm_bytes: dict[str, float]
    comm_sent_bytes: dict[str, float]
    comm_sent_bytes_theory: dict[str, float]
    bandwidth_bytes_per_s: float | None
    peak_memory_bytes_per_rank: list[int]
    state_bytes_this_rank: dict[str, int]
    world_size: int
    dp_size: int
    tp_size: int
    nodes: int
    processes_per_node: int
    backend: str | None


@dataclass
class StepRecord:
    step: int
    tokens: int  # seen since the run began, the whole job's
    loss: float
    lr: float
    grad_norm: float
    tokens_per_s: float  # the whole job's
    tokens_per_s_per_device: float
    mfu: float | None  # per device, against one device's peak
    phase_s: dict[str, float]  # one timed step of the window
    peak_memory_bytes: int
    parallel: ParallelRecord | None = None

    def to_json(self) -> dict:
        record = asdict(self)
        record.update(record.pop("parallel") or {})  # flat, as readers of metrics.jsonl expect
        return record


@dataclass
class EvalRecord:
    step: int
    tokens: int
    val_loss: float
    val_ppl: float
    val_tokens: int
    eval_full_split: bool
    eval_s: float
    peak_memory_bytes_per_rank: list[int]

    def to_json(self) -> dict:
        return asdict(self)


# A step's phases (evaluation is timed in its own records).
PHASES_OF_A_STEP = ("data", "forward", "backward", "optimizer", "other")


def step_record(done: int, lr: float, result, clock: PhaseClock, elapsed: float, steps: int, tokens_per_step: int,
                world_size: int, flops_per_token: float, peak_flops: float | None, device: torch.device,
                parallel: ParallelRecord | None) -> StepRecord:
    """The record of a log window of `steps` steps that took `elapsed` seconds, ending with step `done`."""
    tokens_per_s = tokens_per_step * steps / elapsed
    per_device = tokens_per_s / world_size
    return StepRecord(done, done * tokens_per_step, result.loss, lr, result.grad_norm, tokens_per_s, per_device,
                      per_device * flops_per_token / peak_flops if peak_flops else None,
                      {phase: round(clock.seconds.get(phase, 0.0), 4) for phase in PHASES_OF_A_STEP},
                      peak_memory_bytes(device), parallel)


def parallel_record(snapshot: dict, elapsed: float, steps: int, ctx, theory: dict, comm_is_exposed_wait: bool,
                    peaks: list[int], state_bytes: dict[str, int]) -> ParallelRecord:
    """Communication of a log window (a CommsMeter snapshot) per step, beside its theoretical volume."""
    exposed = snapshot["exposed_comm_s"] if comm_is_exposed_wait else snapshot["comm_s"]
    sent = sum(snapshot["sent_bytes"].values())
    return ParallelRecord(
        comm_s=snapshot["comm_s"] / steps, exposed_comm_s=exposed / steps, compute_s=(elapsed - exposed) / steps,
        comm_share=exposed / elapsed, comm_bytes={k: v / steps for k, v in snapshot["payload_bytes"].items()},
        comm_sent_bytes={k: v / steps for k, v in snapshot["sent_bytes"].items()},
        comm_sent_bytes_theory=theory["sent_bytes"],
        bandwidth_bytes_per_s=sent / snapshot["comm_s"] if snapshot["comm_s"] else None,
        peak_memory_bytes_per_rank=peaks, state_bytes_this_rank=state_bytes,
        world_size=ctx.world_size, dp_size=ctx.dp_size, tp_size=ctx.tp_size, **ctx.topology)


def peak_memory_per_rank(ctx) -> list[int]:
    """Every rank's peak memory (a collective: every rank calls it)."""
    peaks = [peak_memory_bytes(ctx.device)] * ctx.world_size
    if ctx.world_size > 1:
        dist.all_gather_object(peaks, peaks[0])
    return peaks


class MetricsLog:
    """A run's records: `metrics.jsonl` (appended and flushed record by record), with `curves` the picture
    `curves.png` redrawn at every evaluation, and with `tensorboard` the same scalars as event files under
    `tb/`.  Rank 0 only; the other ranks get NullLog."""

    def __init__(self, out_dir: Path, tensorboard: bool = False, resumed_at: int | None = None, curves: bool = True):
        """A new run starts the file anew; one resumed at a step keeps the records up to that step and
        appends to them."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir = out_dir
        if resumed_at is not None:
            keep_records_up_to(out_dir / METRICS_FILE, resumed_at)
        if resumed_at is None:  # a new run's log is a new file: the old name may be a hard link into another run
            (out_dir / METRICS_FILE).unlink(missing_ok=True)
        self.file = open(out_dir / METRICS_FILE, "w" if resumed_at is None else "a")
        self.tensorboard = TensorBoardLog(out_dir / TENSORBOARD_DIR) if tensorboard else None
        self.curves = curves

    def write(self, record: StepRecord | EvalRecord) -> None:
        self.file.write(json.dumps(record.to_json()) + "\n")
        self.file.flush()
        if self.tensorboard:
            self.tensorboard.write(record)
        if self.curves and isinstance(record, EvalRecord):
            plot_runs([self.out_dir], self.out_dir / CURVES_FILE)


def keep_records_up_to(path: Path, step: int) -> None:
    """Drop the records a killed run wrote after its last checkpoint (the resumed run writes those steps
    again) and a last line cut short, so the file counts steps once, in order."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json_value(line)
            if record["step"] <= step:
                kept.append(line)
        except (Unparsable, KeyError, TypeError):
            continue
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


class TensorBoardLog:
    """The scalars of each record as TensorBoard events, against the step: training, validation, memory,
    the phases of a step and, in a distributed run, communication."""
    SCALARS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
               "tokens_per_s": "train/tokens_per_s", "mfu": "train/mfu", "val_loss": "validation/loss",
               "val_ppl": "validation/perplexity", "eval_s": "validation/seconds",
               "peak_memory_bytes": "memory/peak_bytes", "comm_share": "parallel/comm_share",
               "exposed_comm_s": "parallel/exposed_comm_s", "bandwidth_bytes_per_s": "parallel/bandwidth_bytes_per_s"}

    def __init__(self, folder: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch imports tensorboard only here; it is an optional dependency
            raise TensorBoardMissing("--tensorboard needs the tensorboard package: pip install tensorboard "
                                     "(or drop --tensorboard)") from e
        self.writer = SummaryWriter(str(folder))

    def write(self, record: StepRecord | EvalRecord) -> None:
        flat = record.to_json()
        scalars = {tag: flat.get(key) for key, tag in self.SCALARS.items()}
        scalars.update({f"phase/{phase}_s": seconds for phase, seconds in (flat.get("phase_s") or {}).items()})
        scalars.update({f"memory/rank_{rank}_peak_bytes": peak
                        for rank, peak in enumerate(flat.get("peak_memory_bytes_per_rank") or [])})
        for tag, value in scalars.items():
            if value is not None:
                self.writer.add_scalar(tag, value, record.step)
        self.writer.flush()


class TensorBoardMissing(UserError):
    pass


class NullLog:
    def write(self, record: StepRecord | EvalRecord) -> None:
        pass
