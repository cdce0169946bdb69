"""How a run continues: which of its settings come from the checkpoint and which from the command line.

A resumed run is the saved run.  Its settings come from `training_state/state.json`, except:
- the launch (device, parallel layout, compile, output folder, ...): always this command line's, because
  a run may move to another machine or layout;
- the settings a run may change on the way (more steps, other intervals): this command line's where it
  gives them, each change said in one line;
- everything else (model, data, seed, batch, learning rate and schedule) is fixed: a given flag with
  another value is refused by name, since the result would be neither run.

`--resume auto` is the form for launchers that restart a job with the same command line (torchrun
--max-restarts, a requeued scheduler job): it continues the folder's run if the command line describes
that run (defaults included), starts fresh in an empty folder, and refuses a folder holding another run.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

from storage.training_state import TrainingState
from training.config import TrainConfig, TrainingError

# Settings of the launch, not of the run.
LAUNCH_SETTINGS = ("device", "compile", "activation_checkpointing", "out_dir", "resume", "overwrite", "parallel",
                   "tp_size", "cpu_offload", "dist_timeout_s", "stop_grace_s", "peak_flops", "tensorboard", "curves")
# Settings of the run that may change when it is resumed.
CHANGEABLE_SETTINGS = ("max_steps", "eval_interval", "eval_batches", "log_interval", "checkpoint_interval",
                       "checkpoint_minutes", "final_eval_batches")
FIXED_SETTINGS = tuple(f.name for f in dataclasses.fields(TrainConfig)
                       if f.name not in LAUNCH_SETTINGS + CHANGEABLE_SETTINGS)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def fits(value, kind) -> bool:
    """Whether a JSON value is of a TrainConfig field's type (str, int, float, bool, or one of them or None)."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return any(fits(value, option) for option in typing.get_args(kind))
    if kind is type(None):
        return value is None
    if kind is float:  # JSON writes 3e-4 and 1.0 alike; an integer is a float's value too, a bool is not
        return type(value) in (int, float)
    return type(value) is kind


def check_setting_types(settings: dict, state_path: Path) -> None:
    """Each saved setting has its field's type: the bounds TrainConfig checks pass None and the rest would fail
    deep inside the run (a batch size of null, a learning rate of "3e-4")."""
    hints = typing.get_type_hints(TrainConfig)
    for name, value in settings.items():
        if name in hints and name not in LAUNCH_SETTINGS and not fits(value, hints[name]):
            kind = getattr(hints[name], "__name__", str(hints[name]))  # int, or int | None
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:60] + "..."
            raise TrainingError(f"{state_path}: train_config \"{name}\" is {shown}, not {kind}; the "
                                f"checkpoint is damaged -- resume from another checkpoint or start a new run with "
                                f"another --out-dir")


def resumed_config(cfg: TrainConfig, given: set[str], state: TrainingState, state_path: Path,
                   dp_size: int) -> tuple[TrainConfig, list[str]]:
    """The saved run's config under this launch, with the changes `given` asks for; and one phrase per
    change.  The per-rank batch is re-derived so the global batch stays the same under another layout."""
    check_setting_types(state.train_config, state_path)
    try:
        saved = TrainConfig(**{**state.train_config, **{name: getattr(cfg, name) for name in LAUNCH_SETTINGS}})
    except TypeError as e:  # a setting this version does not know (or lacks)
        raise TrainingError(f"{state_path}: its train_config cannot be read ({e}); the checkpoint is damaged "
                            f"or was written by another version of train.py") from e
    except TrainingError as e:
        raise TrainingError(f"{state_path}: {e}; the checkpoint is damaged") from e
    # Under --resume auto the command line describes the run to continue, defaults and all.
    compared = set(FIXED_SETTINGS) if cfg.resume == "auto" else given & set(FIXED_SETTINGS)
    different = [name for name in FIXED_SETTINGS if name in compared and getattr(cfg, name) != getattr(saved, name)]
    if different:
        asked = ", ".join(f"{flag(n)} {getattr(cfg, n)}" for n in different)
        was = ", ".join(f"{flag(n)} {getattr(saved, n)}" for n in different)
        raise TrainingError(f"{cfg.out_dir} holds a run trained with {was}; a resumed run cannot change that "
                            f"({asked} asked). Drop {'the flag' if len(different) == 1 else 'those flags'} to "
                            f"continue the run, or start a new one with another --out-dir")
    step, global_batch = state.step, state.global_batch or saved.batch_size  # older checkpoints lack the latter
    check_position(state, saved, global_batch, state_path)
    changes = {name: getattr(cfg, name) for name in CHANGEABLE_SETTINGS
               if name in given and getattr(cfg, name) != getattr(saved, name)}
    if "max_steps" not in changes and saved.max_steps < step:
        raise TrainingError(f"{state_path}: \"step\" {step} is beyond the run's own --max-steps "
                            f"{saved.max_steps}; the checkpoint is damaged")
    if changes.get("max_steps", saved.max_steps) < step:
        raise TrainingError(f"--max-steps {changes['max_steps']} is below step {step}, where {cfg.out_dir} "
                            f"was saved; give at least {step} (the run was set to {saved.max_steps})")
    if global_batch % dp_size:
        raise TrainingError(f"the run was trained with a global batch of {global_batch} sequences, which "
                            f"{dp_size} data-parallel ranks cannot share evenly; resume on a divisor of {global_batch}")
    said = [f"{flag(name)} {value} (was {getattr(saved, name)})" for name, value in changes.items()]
    if "max_steps" in changes:
        said[0] += f", so the learning-rate schedule now ends at step {changes['max_steps']}"
    return dataclasses.replace(saved, **changes, batch_size=global_batch // dp_size), said


def check_position(state: TrainingState, saved: TrainConfig, global_batch: int, state_path: Path) -> None:
    """The saved step, batch and data position agree with the run's own settings: the batch is the per-rank
    batch times the data-parallel ranks that wrote it, and the sampler has handed out whole global batches,
    no more than the steps taken."""
    def damaged(field: str, value, why: str) -> TrainingError:
        return TrainingError(f"{state_path}: \"{field}\" is {value!r}, but {why}; the checkpoint is damaged -- "
                             f"resume from another checkpoint or start a new run with another --out-dir")

    world, tp = state.parallel.get("world_size"), state.parallel.get("tp_size")
    if type(world) is int and type(tp) is int and 1 <= tp <= world and world % tp == 0:
        if global_batch != saved.batch_size * (world // tp):
            raise damaged("global_batch", global_batch, f"the run that wrote it had --batch-size "
                                                        f"{saved.batch_size} on {world // tp} data-parallel rank(s)")
    elif global_batch % saved.batch_size:
        raise damaged("global_batch", global_batch, f"the run's --batch-size {saved.batch_size} does not divide it")
    position = state.sampler
    for name in ("epoch", "cursor", "seed"):  # the fields of data/loader.py's WindowSampler.state_dict
        if type(position.get(name)) is not int or not 0 <= position[name] < 2**63:
            raise damaged(f"sampler.{name}", position.get(name), "it must be a whole number from 0 to 2**63 - 1")
    micro_batches = state.step * saved.grad_accum
    if position["seed"] != saved.seed:
        raise damaged("sampler.seed", position["seed"], f"the run's --seed is {saved.seed}")
    if position["epoch"] > micro_batches:
        raise damaged("sampler.epoch", position["epoch"], f"{micro_batches} micro-batches cannot reach that epoch")
    if position["cursor"] % global_batch or position["cursor"] > micro_batches * global_batch:
        raise damaged("sampler.cursor", position["cursor"], f"the sampler hands out whole global batches of "
                                                            f"{global_batch}, {micro_batches} of them so far")
