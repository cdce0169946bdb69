"""How a round cuts the model: one class per `--method`, one small interface.

The round loop (prune/iterative.py) calls only this interface: `score` chooses what to cut to reach a
sparsity, `apply` cuts it (returning the model, possibly rebuilt smaller, and the masks fine-tuning must
enforce), `describe` says in the report what the method prunes.  The algorithms themselves live in
magnitude.py, wanda.py and structured.py.  Adding a method means adding a class here and listing it in
`METHODS`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from model.config import GPTConfig
from model.gpt import GPT
from prune.errors import PruneError
from prune.magnitude import magnitude_masks
from prune.masks import MaskSet, block_linear_weights, parse_param_groups, prunable_parameters
from prune.structured import check_widths, select_units, shrink
from prune.wanda import input_feature_norms, wanda_masks


@dataclass(frozen=True)
class ScoringInputs:
    """What a method may score with besides the weights; fixed for the whole run."""
    reference: GPTConfig  # the widths before the first round, which row pruning's shares are taken of
    calibration: list | None  # training batches whose activations wanda scores with
    device: torch.device


class PruningMethod:
    name: ClassVar[str]
    needs_calibration: ClassVar[bool] = False

    def __init__(self, prune_params: str):
        """`prune_params` is --prune-params as given; a method that cannot prune those groups refuses here."""
        self.prune_params = prune_params
        self.groups = parse_param_groups(prune_params)

    def check(self, config: GPTConfig, target: float) -> None:
        """Refuse a target this model cannot be cut to, before anything is loaded or timed."""

    def pruned_tensors(self, model: GPT) -> list[torch.Tensor]:
        """The tensors whose sparsity the report counts."""
        raise NotImplementedError

    def score(self, model: GPT, sparsity: float, previous: MaskSet | None, inputs: ScoringInputs):
        """What to cut so that `sparsity` of the pruned tensors is gone; changes nothing yet."""
        raise NotImplementedError

    def apply(self, model: GPT, cut) -> tuple[GPT, MaskSet | None]:
        """Make the cut `score` chose: the model to go on with and the masks that keep the cut weights at zero."""
        raise NotImplementedError

    def describe(self) -> str:
        """What this method prunes, in the report's words."""
        raise NotImplementedError

    def round_details(self, model: GPT) -> dict:
        """Entries this method adds to each round's report row."""
        return {}


class MaskedMethod(PruningMethod):
    """Unstructured: weights are zeroed in place and masks keep them zero; the model keeps its shape."""

    def parameters(self, model: GPT) -> dict[str, torch.nn.Parameter]:
        return prunable_parameters(model, self.groups)

    def pruned_tensors(self, model):
        return list(self.parameters(model).values())

    def apply(self, model, cut: MaskSet):
        cut.apply()
        return model, cut

    def describe(self):
        return self.prune_params


class Magnitude(MaskedMethod):
    """Global: the smallest |w| across all pruned tensors go first."""
    name = "magnitude"

    def score(self, model, sparsity, previous, inputs):
        return magnitude_masks(self.parameters(model), sparsity, previous)


class Wanda(MaskedMethod):
    """|w| x the norm of the activation entering it, ranked within each output row."""
    name = "wanda"
    needs_calibration = True

    def __init__(self, prune_params: str):
        super().__init__(prune_params)
        if self.groups != ("linear",):
            raise PruneError("wanda scores weights by the activations entering them, so it prunes linear weights "
                             "only; use --prune-params linear")

    def score(self, model, sparsity, previous, inputs):
        params = self.parameters(model)
        norms = input_feature_norms(model, params, inputs.calibration, inputs.device)
        return wanda_masks(params, norms, sparsity, previous)


class Row(PruningMethod):
    """Structured: whole MLP hidden units and attention heads go, and the layers are rebuilt smaller."""
    name = "row"

    def check(self, config, target):
        check_widths(config, target)

    def pruned_tensors(self, model):
        return list(block_linear_weights(model).values())

    def score(self, model, sparsity, previous, inputs):
        return select_units(model, sparsity, inputs.reference)

    def apply(self, model, cut: tuple[list[torch.Tensor], list[torch.Tensor]]):
        keep_hidden, keep_heads = cut
        return shrink(model, keep_hidden, keep_heads), None

    def describe(self):
        return "block linear weights (rows/heads)"

    def round_details(self, model):
        return {"widths": {"mlp_hidden": model.config.mlp_hidden, "n_head_per_layer": model.config.n_head_per_layer}}


METHODS: dict[str, type[PruningMethod]] = {cls.name: cls for cls in (Magnitude, Row, Wanda)}
