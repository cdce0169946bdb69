"""The registry: every experiment of the benchmark, in the report's order.

Each module here defines one `EXPERIMENT` (bench/experiment.py says what it holds).  Adding an
experiment is adding its module and its line below; `python -m bench.experiments`, bench/run_all.py
and bench/report.py pick it up from this list.
"""
from __future__ import annotations

from bench.experiment import Experiment, SettingsError
from bench.experiments import (batch_sweep, comm_strategies, compression, data_loading, data_prep, faults,
                               first_request, fused_step, generate_speed, one_off_decode, phase_profile, playground,
                               prefix_cache, precision_memory, prune_speed, serve_speed, speculative, tp_vs_fsdp,
                               train_speed, user_start)

EXPERIMENTS: tuple[Experiment, ...] = (
    batch_sweep.EXPERIMENT,
    data_prep.EXPERIMENT,
    data_loading.EXPERIMENT,
    phase_profile.EXPERIMENT,
    precision_memory.EXPERIMENT,
    comm_strategies.EXPERIMENT,
    tp_vs_fsdp.EXPERIMENT,
    compression.EXPERIMENT,
    train_speed.EXPERIMENT,
    generate_speed.EXPERIMENT,
    serve_speed.EXPERIMENT,
    prune_speed.EXPERIMENT,
    speculative.EXPERIMENT,
    faults.EXPERIMENT,
    one_off_decode.EXPERIMENT,
    playground.EXPERIMENT,
    first_request.EXPERIMENT,
    prefix_cache.EXPERIMENT,
    user_start.EXPERIMENT,
    fused_step.EXPERIMENT,
)


def find(name: str) -> Experiment:
    for experiment in EXPERIMENTS:
        if experiment.name == name:
            return experiment
    raise SettingsError(f"no experiment {name!r}; choose from {', '.join(e.name for e in EXPERIMENTS)}")
