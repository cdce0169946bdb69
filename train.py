"""Train GPT-2 on one device (and, through `parallel/`, on many).

    python train.py                                    # tiny model on the built-in corpus, CPU-sized
    python train.py --model gpt2 --dataset wikitext-103 --batch-size 16 --grad-accum 4 --compile
    torchrun --nproc_per_node=4 train.py --parallel fsdp          # ddp, fsdp, tp, allreduce, gather-scatter
    torchrun --nproc_per_node=4 train.py --parallel fsdp --tp-size 2   # 2D: tp inside, FSDP across

Logs to the console and to OUT/metrics.jsonl; checkpoints (model.safetensors, config.json,
training_state/) are written atomically to OUT/, and `--resume` continues exactly.  The loop itself
is training/trainer.py.
"""
from __future__ import annotations

if __name__ == "__main__":  # first: a stop sent while the imports below take seconds is noted (runtime/stopping.py)
    from runtime.stopping import note_stops_while_starting
    note_stops_while_starting()

import signal

import torch.distributed as dist

from data.corpus import local_dataset_path
from data.local_files import skipping_unreadable
from parallel import init_distributed, layout_from_flags
from parallel.distributed import announce_failure, exit_rank, failed_rank, launched_by_torchrun, shutdown
from runtime.cli import entry_point, given_fields, parse_config
from runtime.device import choose_device
from runtime.errors import UserError
from runtime.stopping import Stopped, stop_by_default
from storage.artifact import read_meta
from storage.claim import missing_folders, refuse_output_in_dataset, remove_unused_folders
from storage.hub import resolve_checkpoint
from training.config import TrainConfig, TrainingError
from training.metrics import EvalRecord
from training.stop_signals import STOP_SIGNALS
from training.trainer import Trainer

__all__ = ["TrainConfig", "TrainingError", "train", "main"]


def train(cfg: TrainConfig, given: set[str] | None = None) -> EvalRecord:
    """Train (one process, or this rank of a torchrun job); returns the final validation record.  `given`:
    the settings the command line named, which a resumed run takes over its saved ones."""
    if launched_by_torchrun():  # the launcher stops its ranks (training/stop_signals.py takes over in the loop)
        stop_by_default()
    if (dataset := local_dataset_path(cfg.dataset)) is not None:  # before anything is written
        refuse_output_in_dataset(dataset, cfg.out_dir, "--out-dir")
    if cfg.init_from:  # a name that is not there, or a hub model not to be had, fails before anything starts
        cfg.check_init_size(read_meta(resolve_checkpoint(cfg.init_from, "--init-from")).model, given or set())
    layout = layout_from_flags(cfg.parallel, cfg.tp_size)
    ctx = init_distributed(layout.dims, choose_device(cfg.device), cfg.dist_timeout_s)
    created = missing_folders(cfg.out_dir) if ctx.is_writer else []
    final = None
    try:
        with skipping_unreadable(cfg.skip_unreadable), Trainer(cfg, ctx, layout.strategy, given) as trainer:
            final = trainer.fit()
        if ctx.world_size > 1:
            # No rank tears the group down while another still works (rank 0 writes the last records and the
            # curves): a rank that destroyed it early intermittently ended the job with exit code 1.
            dist.barrier()
        return final
    except BaseException as e:
        # A run that stops before it wrote anything (bad data, a refused --resume) leaves no new --out-dir.
        remove_unused_folders(created)
        if isinstance(e, Stopped) and final is not None:  # the training loop's own stop handling had ended
            raise e.saying(f"after the run finished; its last checkpoint in {cfg.out_dir} is whole") from None
        if isinstance(e, (UserError, SystemExit, Stopped)) or ctx.world_size == 1:
            raise
        if isinstance(e, dist.DistError) or "gloo" in str(e).lower() or "nccl" in str(e).lower():
            culprit = failed_rank()
            raise TrainingError(f"rank {ctx.rank}: a collective failed ({str(e).splitlines()[0][:200]}); "
                                f"{f'rank {culprit} stopped first' if culprit else 'another rank exited or hung'}"
                                f" -- stopping (collective timeout {cfg.dist_timeout_s:g}s)") from e
        announce_failure(ctx)
        raise
    finally:
        shutdown(ctx)


# A stop while starting (SIGINT or SIGTERM, runtime/stopping.py): the training loop ends its own stops with their
# message (training/stop_signals.py).
@entry_point(interrupted="while starting; nothing was saved in this run")
def main(argv=None) -> None:
    cfg, given = parse_config(TrainConfig, __doc__, argv), given_fields(TrainConfig, argv)
    cfg.check_model_named(given)
    train(cfg, given)


if __name__ == "__main__":
    if not launched_by_torchrun():
        try:
            main()
        finally:  # the run has ended and said how: a late signal (a second Ctrl-C) must not kill the teardown
            for stop_signal in STOP_SIGNALS:
                signal.signal(stop_signal, signal.SIG_IGN)
    else:  # a rank ends without the interpreter's teardown, where torch's leftover gloo threads can abort it
        try:
            main()
        except SystemExit as e:
            exit_rank(e.code)
        exit_rank(0)
