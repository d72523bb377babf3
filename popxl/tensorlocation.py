"""Tensor location descriptions (kept for API compatibility)."""

from __future__ import annotations

import enum


class TensorStorage(enum.Enum):
    """Where a tensor lives: on chip, or off chip in streaming memory."""

    OnChip = "OnChip"
    OffChip = "OffChip"


class ReplicatedTensorSharding(enum.Enum):
    """Whether a tensor is sharded across replicas."""

    On = "On"
    Off = "Off"


class TileSet(enum.Enum):
    """Which tiles an op runs on."""

    Compute = "Compute"
    IO = "IO"
    Undefined = "Undefined"
    N = "N"


class ExecutionContext(enum.Enum):
    """Which program fragment an op belongs to."""

    Normal = "Normal"
    AccumulateOuterFragment = "AccumulateOuterFragment"
    WeightsFromHostFragment = "WeightsFromHostFragment"
    WeightsToHostFragment = "WeightsToHostFragment"
    OptimizerFromHostFragment = "OptimizerFromHostFragment"
    Subgraph = "Subgraph"


class TensorLocation:
    """Storage and sharding of a tensor."""

    def __init__(
        self,
        storage: TensorStorage = TensorStorage.OnChip,
        replicated_tensor_sharding: ReplicatedTensorSharding = ReplicatedTensorSharding.Off,
    ) -> None:
        self._storage = storage
        self._rts = replicated_tensor_sharding

    @property
    def storage(self) -> TensorStorage:
        return self._storage

    @property
    def replicated_tensor_sharding(self) -> ReplicatedTensorSharding:
        return self._rts

    def __repr__(self) -> str:
        return f"TensorLocation(storage={self._storage}, replicated_tensor_sharding={self._rts})"


__all__ = [
    "TensorStorage",
    "ReplicatedTensorSharding",
    "TileSet",
    "ExecutionContext",
    "TensorLocation",
]
