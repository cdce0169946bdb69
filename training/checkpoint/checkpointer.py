"""The checkpointer: a run folder claimed for a new or resumed run, its state saved when due and restored on
resume (the package's docstring says where and how; storage/ writes and reads the files)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist

from data.loader import WindowSampler
from model.config import GPTConfig
from parallel.errors import ParallelError
from runtime.provenance import provenance
from storage.artifact import WEIGHTS_FILE, artifact_writers, load_model, write_folder_atomically
from storage.claim import claim_output_folder
from storage.folder import DiskFull, acquire_writer_lock, release_writer_lock
from storage.run_folder import TRAINING_TOOL, is_training_checkpoint
from storage.training_state import OPTIMIZER_FILE, STATE_FILE, TrainingState
from training.checkpoint.gather import full_model_state, full_optimizer_state, load_optimizer_state
from training.checkpoint.resume import resumed_config
from training.config import TrainConfig, TrainingError


def save_through_python(obj, path: Path) -> None:
    """torch.save into a file object Python writes, so a full disk is an OSError with its errno (saved to a
    path name, torch's C++ writer reports only `unexpected pos`)."""
    with open(path, "wb") as f:
        torch.save(obj, f)


def first_non_finite(state: dict[str, torch.Tensor]) -> str | None:
    return next((name for name, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)


def load_init_model(cfg: TrainConfig) -> torch.nn.Module:
    """The model --init-from names."""
    model, _ = load_model(cfg.init_from, kinds=("float", "pruned"), why="train.py trains floating-point models")
    return model


def claim_run_folder(cfg: TrainConfig) -> tuple[bool, torch.nn.Module | None]:
    """Make this process the one writer of --out-dir (storage/folder.py) before anything in it is read, and
    refuse a folder that holds another run or another tool's artifact unless --resume or --overwrite.
    Returns whether the run resumes (always with --resume, with --resume auto when the folder holds a run)
    and, for a new run, the --init-from model: loaded before --overwrite removes anything, so a source that
    cannot be loaded leaves the folder as it was."""
    out_dir = Path(cfg.out_dir)
    if cfg.resume == "yes" or (cfg.resume == "auto" and is_training_checkpoint(out_dir)):
        acquire_writer_lock(out_dir)
        if not (out_dir / STATE_FILE).exists():
            raise TrainingError(f"--resume: {cfg.out_dir} has no {STATE_FILE}; nothing to resume (use --resume "
                                f"auto to start a new run there, or drop --resume)")
        return True, None
    init_model = load_init_model(cfg) if cfg.init_from else None
    claim_output_folder(out_dir, TRAINING_TOOL, cfg.overwrite, source=cfg.init_from or None,
                        out_flag="--out-dir")
    if is_training_checkpoint(out_dir):  # only without --overwrite, which has removed it
        raise TrainingError(f"{out_dir} already holds a training run; pass --resume to continue it, --overwrite "
                            f"to replace it, or --out-dir to start a new one")
    return False, init_model


class Checkpointer:
    """One run folder from claim to release, and the run's state in it.  `open` claims the folder (rank 0)
    and settles whether the run resumes and with which settings; `saved_model` is a resumed run's model,
    built once from its weights; `register` names the stateful objects once (the parallelised model, the
    optimizer, the data sampler); `load` restores them and the RNG from the folder, `save(step)` writes them,
    when `due(step)` says so; `close` releases the folder.  Every rank calls it (consolidation is
    collective); rank 0 alone writes."""

    def __init__(self, out_dir: Path, ctx):
        self.out_dir, self.ctx = out_dir, ctx
        self.cfg: TrainConfig | None = None
        self.resuming = False
        self.last_saved_step: int | None = None
        self._claimed = False
        self._registered: tuple | None = None
        self._saved_state: TrainingState | None = None  # a resumed run's state.json, read once
        self.init_model: torch.nn.Module | None = None  # a new run's --init-from model, as the claim loaded it

    def open(self, cfg: TrainConfig, given: set[str]) -> tuple[TrainConfig, list[str]]:
        """Claim the folder and return the run's config (the saved one when resuming, with the changes
        `given` asks for) and one phrase per change."""
        if self.ctx.is_writer:
            self._claimed = True  # claiming can take the lock and then refuse the folder: close() releases it
            self.resuming, self.init_model = claim_run_folder(cfg)
        if self.ctx.world_size > 1:  # rank 0 decides, so every rank resumes or none does
            decision = [self.resuming]
            dist.broadcast_object_list(decision, src=0)
            self.resuming = decision[0]
        changes: list[str] = []
        if self.resuming:
            self._saved_state = TrainingState.read(self.out_dir)
            cfg, changes = resumed_config(cfg, given, self._saved_state, self.out_dir / STATE_FILE, self.ctx.dp_size)
        self.cfg = cfg
        return cfg, changes

    def close(self) -> None:
        if self._claimed:
            release_writer_lock(self.out_dir)
            self._claimed = False

    def saved_model(self) -> torch.nn.Module:
        """The resumed run's model with its saved weights (full, on the CPU, before it is parallelised: every
        layout slices them the same way)."""
        model, meta = load_model(self.out_dir, "cpu")
        if meta.step is not None and meta.step != self._saved_state.step:  # one save writes both files
            raise self.damaged(self.out_dir / STATE_FILE, f"its step {self._saved_state.step} is not the step "
                                                          f"{meta.step} of the weights beside it")
        return model

    def register(self, par, model_config: GPTConfig, optimizer: torch.optim.Optimizer,
                 sampler: WindowSampler) -> None:
        """The state `load` restores and `save` writes: `par` (the parallelised model, consolidated to
        single-device tensors when saved), its config, the optimizer and the data position."""
        self._registered = (par, model_config, optimizer, sampler)

    def due(self, step: int, last: bool = False, by_clock: bool = False) -> bool:
        """Whether `step` is to be saved: every --checkpoint-interval steps, when --checkpoint-minutes have passed
        (`by_clock`, as the ranks agreed) and the last, once."""
        return step != self.last_saved_step and (last or by_clock or step % self.cfg.checkpoint_every == 0)

    def save(self, step: int) -> None:
        """Write the registered state as the checkpoint of `step`.  The weights and then the optimizer state are each
        consolidated when their file is written, and dropped after it, so the writer never holds both (gigabytes at
        GPT-2 Medium); the other ranks take part in the same gatherings, in the same order, keeping nothing."""
        par, model_config, optimizer, sampler = self._registered
        ctx = par.ctx
        if ctx.is_writer:
            self.write(step)
        else:
            full_model_state(par)
            full_optimizer_state(par, optimizer)
        if ctx.world_size > 1:
            dist.barrier()  # nobody reads the folder before it is complete
        self.last_saved_step = step

    def write(self, step: int) -> None:
        par, model_config, optimizer, sampler = self._registered
        ctx = par.ctx
        state = TrainingState(
            step=step, sampler=sampler.state_dict(), global_batch=sampler.global_batch,
            train_config=dataclasses.asdict(self.cfg), torch_rng=torch.get_rng_state().tolist(),
            cuda_rng=[s.tolist() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
            parallel={"mode": self.cfg.parallel, "world_size": ctx.world_size, "tp_size": ctx.tp_size})

        def finite(tensors: dict[str, torch.Tensor]) -> None:
            bad = first_non_finite(tensors)
            if bad:  # raised by a writer: the staged files are discarded, the folder keeps its last checkpoint
                raise TrainingError(f"step {step}: {bad} holds NaN or infinite values; not saving it over "
                                    f"{self.describe_last_good()}")

        produced_by, extra = provenance(TRAINING_TOOL, self.cfg.init_from), {"step": step}

        def write_weights(path: Path) -> None:
            model_state = {k: v.contiguous() for k, v in full_model_state(par).items()}
            finite(model_state)
            artifact_writers(model_state, model_config, "float", produced_by, extra)[WEIGHTS_FILE](path)

        def write_optimizer(path: Path) -> None:
            optimizer_state = full_optimizer_state(par, optimizer)
            finite({f"optimizer state of {name}.{key}": v for name, entry in optimizer_state["state"].items()
                    for key, v in entry.items() if torch.is_tensor(v)})
            save_through_python(optimizer_state, path)
        # Written in this order (the weights' file is artifact_writers' first), the other ranks' gatherings' order.
        writers = {**artifact_writers({}, model_config, "float", produced_by, extra), WEIGHTS_FILE: write_weights,
                   OPTIMIZER_FILE: write_optimizer, STATE_FILE: state.write}

        def in_place() -> None:  # recorded before a signal held during the move can stop the run
            self.last_saved_step = step
        try:
            write_folder_atomically(self.out_dir, writers, on_saved=in_place)
        except DiskFull as e:
            raise TrainingError(f"step {step}: {e}. Last good: {self.describe_last_good()}") from e

    def describe_last_good(self) -> str:
        if self.last_saved_step is None:
            return f"{self.out_dir}: no checkpoint was written in this run yet"
        return f"the checkpoint of step {self.last_saved_step} in {self.out_dir}, which is intact"

    def load(self) -> int:
        """Restore the registered optimizer and data position, and the RNG, from the saved step and return
        that step (0 for a new run; a resumed model already holds its weights, from `saved_model`).  Damage to
        either file is one error line naming the file."""
        if not self.resuming:
            return 0
        par, _, optimizer, sampler = self._registered
        state_path, optimizer_path = self.out_dir / STATE_FILE, self.out_dir / OPTIMIZER_FILE
        state = self._saved_state
        if not optimizer_path.exists():
            raise self.damaged(optimizer_path, "it is missing")
        try:
            saved = torch.load(optimizer_path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch.load raises many types for truncated or foreign files
            raise self.damaged(optimizer_path, f"it cannot be read ({type(e).__name__}: "
                                               f"{str(e).splitlines()[0][:160]})") from e
        try:
            load_optimizer_state(par, optimizer, saved)
        except (ParallelError, RuntimeError, KeyError, TypeError, ValueError, IndexError) as e:
            raise self.damaged(optimizer_path, f"it does not fit this model's optimizer ({type(e).__name__}: "
                                               f"{str(e).splitlines()[0][:160]})") from e
        try:
            sampler.load_state_dict(state.sampler)
            torch.set_rng_state(torch.tensor(state.torch_rng, dtype=torch.uint8))
        except (RuntimeError, KeyError, TypeError, ValueError) as e:
            raise self.damaged(state_path, f"its sampler or RNG cannot be used ({type(e).__name__}: "
                                           f"{str(e).splitlines()[0][:160]})") from e
        if state.cuda_rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state.cuda_rng])
        self.last_saved_step = state.step
        return state.step

    @staticmethod
    def damaged(path: Path, what: str) -> TrainingError:
        return TrainingError(f"{path} cannot be resumed from: {what}; the checkpoint is damaged -- start a new run "
                             f"with another --out-dir (or --overwrite)")
