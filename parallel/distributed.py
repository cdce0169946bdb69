"""Process-group setup under torchrun: ranks, the (dp, tp) device mesh, size checks, failure reporting.

`init_distributed` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), so
the same code runs on one machine, on several (`torchrun --nnodes`), on CPU with gloo and on CUDA with
NCCL.  Nothing here is global state: the returned `DistContext` is passed to whoever needs it.  It knows
the layout's sizes (`ParallelDims`) only; which strategy runs on them is parallel/layout.py's business.
"""
from __future__ import annotations

import datetime
import itertools
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, NoReturn, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from model.config import GPTConfig
from parallel.dims import ParallelDims
from parallel.errors import ParallelError
from parallel.job_lines import print_once_per_job
from runtime.device import distributed_backend

FAILURE_KEY = "parallel/failed_rank"
NODE_LEADER_POLL_S = 0.05
_node_leader_calls = itertools.count()  # every rank makes the same calls in the same order
T = TypeVar("T")  # what run_on_node_leader's work returns


@dataclass
class DistContext:
    dims: ParallelDims = ParallelDims()  # one device unless init_distributed joined a group
    rank: int = 0
    device: torch.device = torch.device("cpu")
    mesh: DeviceMesh | None = None  # dims ("dp", "tp")
    dp_rank: int = 0
    tp_rank: int = 0
    owns_process_group: bool = False
    nodes: int = 1  # torchrun agents (--nnodes) in the job
    procs_per_node: int = 1
    backend: str | None = None  # gloo, nccl; None in one process

    @property
    def world_size(self) -> int:
        return self.dims.world_size

    @property
    def dp_size(self) -> int:
        return self.dims.dp

    @property
    def tp_size(self) -> int:
        return self.dims.tp

    @property
    def topology(self) -> dict:
        """What a run's figures were measured on, for its records."""
        return {"nodes": self.nodes, "processes_per_node": self.procs_per_node, "backend": self.backend}

    @property
    def is_writer(self) -> bool:
        """Only one rank prints, logs and writes checkpoints."""
        return self.rank == 0

    @property
    def dp_group(self):
        return self.mesh["dp"].get_group() if self.mesh is not None else None

    @property
    def tp_group(self):
        return self.mesh["tp"].get_group() if self.mesh is not None else None


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launched_world_size() -> int:
    """The ranks of this job: the process group's if one is joined, else torchrun's, else this process."""
    if dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ["WORLD_SIZE"]) if launched_by_torchrun() else 1


def init_distributed(dims: ParallelDims, device: torch.device, timeout_s: float) -> DistContext:
    """Join (or reuse) the default process group and build the mesh from `dims`' sizes."""
    if not dims.distributed:
        return DistContext(dims, device=device)
    owns = False
    if not dist.is_initialized():
        check_restartable_launch(os.environ)
        if device.type == "cuda" and device.index is None:
            check_ranks_fit_devices(int(os.environ.get("LOCAL_WORLD_SIZE", 1)), torch.cuda.device_count())
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
        dist.init_process_group(distributed_backend(device),
                                timeout=datetime.timedelta(seconds=timeout_s))
        owns = True
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = dims.build_mesh(device.type)
    procs_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return DistContext(dims, rank, device, mesh, dp_rank=mesh["dp"].get_local_rank(),
                       tp_rank=mesh["tp"].get_local_rank(), owns_process_group=owns,
                       nodes=int(os.environ.get("GROUP_WORLD_SIZE", world // procs_per_node)),
                       procs_per_node=procs_per_node, backend=str(dist.get_backend()))


def check_restartable_launch(env) -> None:
    """torchrun --max-restarts shares its rendezvous store with the workers by default, and the restarted
    workers then read the dead ones' addresses from it and fail to connect (pytorch/pytorch#135712; seen
    with gloo on torch 2.13).  Refuse at the first launch rather than at the first restart, hours later."""
    if int(env.get("TORCHELASTIC_MAX_RESTARTS", 0)) > 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        raise ParallelError("torchrun --max-restarts cannot restart these workers while its rendezvous store is "
                            "shared with them (pytorch/pytorch#135712); launch with "
                            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun ... (and --resume auto)")


def check_ranks_fit_devices(local_ranks: int, gpus: int) -> None:
    """One CUDA device per rank on this machine, checked before any CUDA call."""
    if local_ranks > gpus:
        raise ParallelError(f"torchrun started {local_ranks} ranks on this machine, which has {gpus} CUDA "
                            f"device{'s' if gpus != 1 else ''}; use --nproc_per_node={gpus} or fewer, or "
                            f"--device cpu to run the ranks on the CPU with gloo")


def check_divisibility(config: GPTConfig, ctx: DistContext) -> None:
    """Refuse, before any training, the sizes the layout cannot split evenly."""
    tp = ctx.tp_size
    if tp > 1:
        for layer in range(config.n_layer):
            heads, hidden = config.layer_n_head(layer), config.layer_mlp_hidden(layer)
            if heads % tp:
                raise ParallelError(f"layer {layer} has {heads} attention heads, not divisible by --tp-size {tp}; "
                                    f"use a tp size that divides {heads}")
            if hidden % tp:
                raise ParallelError(f"layer {layer} has an MLP hidden width of {hidden}, not divisible by "
                                    f"--tp-size {tp}; use a tp size that divides {hidden}")
        if config.padded_vocab_size % tp:
            raise ParallelError(f"the padded vocabulary of {config.padded_vocab_size} rows is not divisible by "
                                f"--tp-size {tp}; use a tp size that divides it (or change vocab_pad_multiple)")


def run_on_node_leader(ctx: DistContext, work: Callable[[], T], what: str) -> T | None:
    """Run `work` on one rank per node (local rank 0) while the node's other ranks wait for it, e.g. to
    tokenize a corpus into the node's cache once instead of once per rank.  Returns what `work` returned on the
    rank that ran it, None on the ranks that waited.

    The wait is on the rendezvous store, not a collective, so it has no timeout however long the work takes;
    if the leader dies, torchrun ends the waiting ranks.  A leader that raises tells its node's ranks, which
    stop with an error pointing at its message."""
    if ctx.world_size == 1:
        return work()
    store = dist.distributed_c10d._get_default_store()
    local_rank = int(os.environ.get("LOCAL_RANK", ctx.rank % ctx.procs_per_node))
    node = int(os.environ.get("GROUP_RANK", ctx.rank // ctx.procs_per_node))
    key = f"node_leader/{next(_node_leader_calls)}/{node}"
    if local_rank == 0:
        try:
            result = work()
        except BaseException as e:
            store.set(key, f"failed: {type(e).__name__}: {e}")
            raise
        store.set(key, "done")
        # Rank 0 holds the store: it must not end (a test, a one-step run) before its node has read the key.
        while int(store.add(f"{key}/read", 0)) < ctx.procs_per_node - 1:
            time.sleep(NODE_LEADER_POLL_S)
        return result
    waited = 0
    while not store.check([key]):
        time.sleep(NODE_LEADER_POLL_S)
        waited += 1
        if waited == 5 and local_rank == 1:  # one line per node, and none when the work was quick
            print(f"rank {ctx.rank}: waiting for local rank 0 to {what} (the node's other ranks wait too)",
                  file=sys.stderr, flush=True)
    outcome = store.get(key).decode()
    store.add(f"{key}/read", 1)
    if outcome != "done":
        raise ParallelError(f"rank {ctx.rank}: local rank 0 could not {what} ({outcome}); see its error")
    return None


def announce_failure(ctx: DistContext) -> None:
    """Leave this rank's number in the rendezvous store so the surviving ranks can name it."""
    if not ctx.owns_process_group and ctx.world_size == 1:
        return
    try:
        dist.distributed_c10d._get_default_store().set(FAILURE_KEY, str(ctx.rank))
    except Exception:  # the store may already be gone; the torchrun summary still names the rank
        pass


def failed_rank() -> str | None:
    """The rank that `announce_failure` named in the rendezvous store, if any did."""
    try:
        store = dist.distributed_c10d._get_default_store()
        return store.get(FAILURE_KEY).decode() if store.check([FAILURE_KEY]) else None
    except Exception:
        return None


def shutdown(ctx: DistContext) -> None:
    if ctx.owns_process_group and dist.is_initialized():
        dist.destroy_process_group()


def exit_rank(status: int | str | None) -> NoReturn:
    """End a torchrun rank's process with `status` (SystemExit's code) but without the interpreter's teardown.

    On torch 2.13 a job's process groups outlive destroy_process_group: DTensor's sharding caches hold the
    device mesh, and torch._dynamo, imported after the group exists, holds the group.  Their gloo threads
    still run while the interpreter shuts down, and there they intermittently aborted a finished job after
    its last checkpoint ("terminate called without an active exception", SIGABRT; 3 of 30 two-rank `tp`
    runs beside another job).  By now every file the run writes is closed; only the console needs flushing."""
    if isinstance(status, str):  # sys.exit("error: ..."): the same line from every rank is said once
        print_once_per_job(status)
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status or 0)
