"""Ranks of a gloo group on loopback, for the tests that hold a layout against one device: each rank runs a job
function and reports back through a JSON file, so an error on any rank reaches the test with its traceback."""
from __future__ import annotations

import datetime
import json
import os
import traceback
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parallel.distributed import exit_rank
from serve.launch import free_port

Job = Callable[[int, int, Path, dict], None]  # (rank, world, root, result): fills `result`


def _rank(rank: int, world: int, port: int, job: Job, root: str) -> None:
    """One rank: join the group, run the job, write its result."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    result = {}
    try:
        job(rank, world, Path(root), result)
    except BaseException as e:  # reported to the test through the result file
        result["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    (Path(root) / f"result_{job.__name__}_{rank}.json").write_text(json.dumps(result))
    if result.pop("exit_now", False):
        os._exit(0)  # a rank that dies without saying goodbye to the group
    dist.destroy_process_group()
    # Then out without the interpreter's teardown, as train.py's torchrun ranks do (parallel.distributed.exit_rank):
    # gloo threads left behind by a dead peer can abort it ("terminate called without an active exception").
    exit_rank(0)


def run_ranks(job: Job, world: int, root: Path, peer_dies: bool = False) -> list[dict]:
    """Every rank's result; the first rank's error fails the test.  `job` is a module-level function (each rank
    is a spawned process that imports it).  `peer_dies`: the job kills a rank on purpose."""
    try:
        mp.spawn(_rank, args=(world, free_port(), job, str(root)), nprocs=world, join=True)
    except mp.ProcessExitedException as e:
        # When a peer dies mid-collective, gloo's own I/O thread can throw instead of failing the waiting call
        # ("terminate called after throwing an instance of 'gloo::IoException' ... Connection reset by peer",
        # SIGABRT; 1 in about 60 dying-rank runs here under load; pytorch/pytorch#50701).  That race is gloo's,
        # not ours: run the job once more, and the second run must name the dead rank.
        if not peer_dies or e.signal_name != "SIGABRT":
            raise
        mp.spawn(_rank, args=(world, free_port(), job, str(root)), nprocs=world, join=True)
    results = [json.loads((root / f"result_{job.__name__}_{r}.json").read_text()) for r in range(world)]
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors[0]
    return results
