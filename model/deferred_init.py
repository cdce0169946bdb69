"""A GPT built without its values (on the meta device), and the values `GPT(config)` would give it after
`torch.manual_seed(seed)`, one full parameter at a time.

A parallel layout builds the model empty, lays it out, and lets each rank keep only its piece of each value as it is
made (parallel/materialize.py): no rank ever holds the whole model, and the pieces are slices of exactly the weights a
single device draws from the same seed (init parity, as Megatron and torchtitan test it).  The values come from
replaying GPT's own initialisation, in its order, on one module's temporary copy at a time: every random draw a
single device makes is made here too, of the same sizes and kinds, so the generator's stream -- and its state
afterwards, which dropout then draws from -- is the single device's.  tests/test_deferred_init.py checks the replay
against `GPT(config)` for every preset shape it can afford.
"""
from __future__ import annotations

import copy
from typing import Callable, Iterator

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from model.config import GPTConfig
from model.gpt import GPT


class _SkippedInitialisers(TorchFunctionMode):
    """torch.nn.init's initialisers do nothing (they return their tensor as it is).  A mode is this thread's
    alone: a model built on another thread meanwhile is initialised as usual."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _INITIALISERS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


_INITIALISERS = {getattr(nn.init, name) for name in ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_",
                                                     "zeros_", "kaiming_uniform_", "kaiming_normal_",
                                                     "xavier_uniform_", "xavier_normal_")}


def empty_model(config: GPTConfig) -> GPT:
    """A GPT of `config` on the meta device, for stored or seeded values to fill.  No initialiser runs: a meta tensor
    holds no values to draw, and torch runs an initialiser on it through its Python reference kernels, whose first
    call imports torch._dynamo, the largest part of a small model's load (tests/test_storage.py checks it stays
    out)."""
    with torch.device("meta"), _SkippedInitialisers():
        return GPT(config)


# One write of GPT's initialisation: the module, the names of its own parameters the write sets, and the write.
Write = tuple[nn.Module, tuple[str, ...], Callable[[nn.Module], None]]


def _post_order(module: nn.Module) -> Iterator[nn.Module]:
    """The modules in the order `nn.Module.apply` visits them: children first."""
    for child in module.children():
        yield from _post_order(child)
    yield module


def _own(module: nn.Module) -> tuple[str, ...]:
    return tuple(name for name, _ in module.named_parameters(recurse=False))


def _writes(skeleton: GPT) -> list[Write]:
    """Every write `GPT.__init__` makes, in its order: each module's own default initialisation as it is built
    (registration order is construction order), then `GPT._init_weights` as `apply` visits (it sets the linear
    layers' and the embeddings' parameters, and leaves the LayerNorms at their defaults), then the residual
    projections."""
    writes: list[Write] = [(m, _own(m), lambda m: m.reset_parameters()) for m in skeleton.modules() if _own(m)]
    writes += [(m, _own(m), GPT._init_weights) for m in _post_order(skeleton)
               if isinstance(m, (nn.Linear, nn.Embedding))]
    config = skeleton.config
    for module_name, module in skeleton.named_modules():
        for local in _own(module):
            if GPT.is_residual_projection(f"{module_name}.{local}"):
                writes.append((module, (local,),
                               lambda m, local=local: GPT.init_residual_projection(getattr(m, local), config)))
    return writes


def seeded_parameters(config: GPTConfig, seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full CPU tensor) for every parameter of `GPT(config)` built after `torch.manual_seed(seed)`, each
    as soon as its value is final, under the names `GPT.named_parameters` gives (the tied head is the embedding).
    At most one module's parameters exist at a time.  Exhausting it leaves the global generator where building the
    model leaves it."""
    torch.manual_seed(seed)
    skeleton = empty_model(config)
    names = {id(p): name for name, p in skeleton.named_parameters()}
    writes = _writes(skeleton)
    last_write = {}
    for index, (module, written, _) in enumerate(writes):
        for local in written:
            last_write[names[id(getattr(module, local))]] = index
    with torch.no_grad():
        for index, (module, written, write) in enumerate(writes):
            # A copy of this module alone (a tied parameter included: it is drawn as the single device draws it).
            temporary = copy.deepcopy(module).to_empty(device="cpu")
            write(temporary)
            for local in written:
                name = names[id(getattr(module, local))]
                if last_write[name] == index:
                    yield name, getattr(temporary, local).detach()
