"""One rank of bench/standalone/shard_memory.py's build-only job, under torchrun: train.py's Trainer builds the run (the model
laid out, the data, the optimizer) and takes no step; rank 0 prints every rank's peak memory up to then as one JSON
line.  The optimizer's state does not exist yet (AdamW makes it at the first step), so the figure is what building
the model costs a rank.

    python -m torch.distributed.run --standalone --nproc_per_node=4 -m bench.standalone.shard_memory_build '<TrainConfig JSON>'
"""
from __future__ import annotations

import json
import sys

from parallel import init_distributed, layout_from_flags
from parallel.distributed import exit_rank, shutdown
from parallel.local_state import local_state_bytes
from runtime.cli import entry_point
from runtime.device import choose_device
from training.config import TrainConfig
from training.metrics import peak_memory_per_rank
from training.trainer import Trainer


@entry_point
def main(argv=None) -> None:
    cfg = TrainConfig(**json.loads((argv or sys.argv[1:])[0]))
    layout = layout_from_flags(cfg.parallel, cfg.tp_size)
    ctx = init_distributed(layout.dims, choose_device(cfg.device), cfg.dist_timeout_s)
    try:
        with Trainer(cfg, ctx, layout.strategy) as trainer:
            peaks = peak_memory_per_rank(ctx)
            state = local_state_bytes(trainer.model, trainer.optimizer)
        if ctx.is_writer:
            print(json.dumps({"built_peak_memory_bytes_per_rank": peaks, "built_state_bytes_rank0": state}), flush=True)
    finally:
        shutdown(ctx)
    exit_rank(0)  # as train.py's ranks end (parallel/distributed.py says why)


if __name__ == "__main__":
    main()
