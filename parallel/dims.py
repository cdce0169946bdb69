"""The parallel layout as sizes (torchtitan's `ParallelDims`): how many ranks replicate the model, how many
shard it, how many split each layer.  Process groups are built from these numbers, never from a mode name
(`parallel/layout.py` turns the command line into them)."""
from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from parallel.errors import ParallelError


@dataclass(frozen=True)
class ParallelDims:
    dp_replicate: int = 1  # data-parallel ranks each holding the whole (tensor-parallel) model: DDP, manual sync
    dp_shard: int = 1  # data-parallel ranks each holding a slice of every parameter: FSDP
    tp: int = 1  # ranks splitting every layer between them (tensor parallelism)
    distributed: bool = False  # one process per rank in a process group (torchrun), even a group of one

    def __post_init__(self):
        if min(self.dp_replicate, self.dp_shard, self.tp) < 1:
            raise ParallelError(f"every parallel degree must be at least 1, got {self}")
        # The mesh has one data-parallel dimension, so replicas of shards (HSDP) cannot be described.
        if self.dp_replicate_enabled and self.dp_shard_enabled:
            raise ParallelError(f"data-parallel replicas of shards are not supported, got {self}")

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each sees its own share of the batch."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """The (dp, tp) mesh over the default process group: tp ranks adjacent, dp across them."""
        return init_device_mesh(device_type, (self.dp, self.tp), mesh_dim_names=("dp", "tp"))
