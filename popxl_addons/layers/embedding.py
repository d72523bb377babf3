"""``Embedding``: a lookup table, optionally sharded over the vocabulary by replica group."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

import popxl
from popxl import ops

from ..module import Module
from ..named_tensors import NamedTensors
from ..utils import WeightsDict
from ._mapping import to_numpy
from .init import truncated_normal

VOCAB_ALIGNMENT = 16
MAPPING_MSG = (
    "Embedding.torch_mapping: the torch table has {rows} rows but the variable holds only "
    "{capacity} ({n_shards} shard(s) of {shard} rows); build the Embedding with a vocab_size "
    "of at least {rows}."
)


class Embedding(Module):
    """Look up rows of a ``(vocab_shard_size, hidden_size)`` table with ``ops.gather``.

    The table holds one vocabulary shard per replica group: with a ``replica_grouping`` of
    ``n_shards = num_groups`` groups, group ``g`` owns the rows
    ``[g * vocab_shard_size, (g + 1) * vocab_shard_size)``. ``vocab_shard_size`` is
    ``ceil(vocab_size / n_shards)`` rounded up to a multiple of 16, **even unsharded**
    (vocab 100 gives a 112-row table).

    ``build(indices)`` creates ``weight`` (truncated normal, std 0.02, in ``dtype``; also
    kept as ``self.weight`` so a tied output layer can use it) and returns
    ``ops.gather(weight, indices, axis, zero_OOR=n_shards > 1)``. When sharded, indices must
    be made relative to the shard beforehand (subtract ``get_offsets(...)[g]``); the rows
    owned by other shards are then out of range and give zeros, so summing the groups'
    results (e.g. a grouped all-reduce) gives the full lookup.

    Args:
        dtype: the table's dtype.
        vocab_size: the number of rows of the full table.
        hidden_size: the length of each row.
        axis: the axis of the table that ``gather`` indexes.
        replica_grouping: groups that each hold one shard (``None``: one unsharded table).

    See also ``torch.nn.Embedding``.
    """

    def __init__(
        self,
        dtype: popxl.dtype,
        vocab_size: int,
        hidden_size: int,
        axis: int = 0,
        replica_grouping: popxl.ReplicaGrouping | None = None,
    ) -> None:
        super().__init__()
        self.dtype = dtype
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.axis = axis
        self.replica_grouping = replica_grouping
        self.n_shards = replica_grouping.num_groups if replica_grouping is not None else 1
        self.vocab_shard_size = Embedding.get_vocab_shard_size(vocab_size, self.n_shards)

    @staticmethod
    def get_vocab_shard_size(vocab_size: int, n_shards: int) -> int:
        """Rows per shard: ``ceil(vocab_size / n_shards)`` rounded up to a multiple of 16."""
        rows = math.ceil(vocab_size / n_shards)
        return VOCAB_ALIGNMENT * math.ceil(rows / VOCAB_ALIGNMENT)

    @staticmethod
    def get_offsets(vocab_size: int, n_shards: int) -> np.ndarray:
        """The first vocabulary row of each shard: ``arange(n_shards) * vocab_shard_size``."""
        shard = Embedding.get_vocab_shard_size(vocab_size, n_shards)
        return np.arange(n_shards * shard, step=shard)

    def build(self, indices: popxl.Tensor) -> popxl.Tensor:
        shape = (self.vocab_shard_size, self.hidden_size)
        self.weight = self.add_variable_input(
            "weight",
            partial(truncated_normal, shape),
            self.dtype,
            replica_grouping=self.replica_grouping,
        )
        return ops.gather(self.weight, indices, self.axis, zero_OOR=self.n_shards > 1)

    @staticmethod
    def torch_mapping(
        variables: NamedTensors, nn_layer: Any, dtype: popxl.dtype = popxl.float32
    ) -> WeightsDict:
        """Host values from a ``torch.nn.Embedding``: its ``(vocab, hidden)`` table padded
        with zero rows to ``n_shards * vocab_shard_size`` and, when sharded, split into one
        shard per group (host shape ``(n_shards, vocab_shard_size, hidden)``)."""
        var = variables.weight
        table = to_numpy(nn_layer.weight, dtype)
        shard, hidden = var.shape
        n_shards = var.shape_on_host[0] if len(var.shape_on_host) > len(var.shape) else 1
        capacity = n_shards * shard
        if table.shape[0] > capacity:
            raise ValueError(
                MAPPING_MSG.format(
                    rows=table.shape[0], capacity=capacity, n_shards=n_shards, shard=shard
                )
            )
        padded = np.zeros((capacity, hidden), table.dtype)
        padded[: table.shape[0]] = table
        return WeightsDict({var: padded.reshape(var.shape_on_host)})


__all__ = ["Embedding"]
