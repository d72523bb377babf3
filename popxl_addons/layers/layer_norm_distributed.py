"""``LayerNormDistributed``: layer norm of a hidden axis sharded over a replica group."""

from __future__ import annotations

from functools import partial

import numpy as np

import popxl
from popxl import ReplicaGrouping

from ..module import Module
from ..ops.layer_norm_distributed import layer_norm_distributed

NO_GROUP_MSG = (
    "LayerNormDistributed needs the replica grouping that shards the hidden axis, e.g. "
    "LayerNormDistributed(replica_grouping=ir.replica_grouping(group_size=tp))."
)


class LayerNormDistributed(Module):
    """Layer normalisation of ``(n, hidden / tp)`` inputs sharded over ``replica_grouping``.

    Variables: ``weight`` = ones and ``bias`` = zeros of ``x.shape[-1]`` (this replica's
    slice), one copy per member of the group (their replica grouping is the transpose of
    ``replica_grouping``, so each shard has its own values).

    ``build(x, eps=1e-5)`` returns this replica's slice of the normalised ``x``.
    """

    def __init__(self, replica_grouping: ReplicaGrouping | None = None) -> None:
        super().__init__()
        self.replica_grouping = replica_grouping

    def build(self, x: popxl.Tensor, eps: float = 1e-5) -> popxl.Tensor:
        if self.replica_grouping is None:
            raise ValueError(NO_GROUP_MSG)
        sharded = self.replica_grouping.transpose()
        w = self.add_variable_input(
            "weight", partial(np.ones, x.shape[-1]), x.dtype, replica_grouping=sharded
        )
        b = self.add_variable_input(
            "bias", partial(np.zeros, x.shape[-1]), x.dtype, replica_grouping=sharded
        )
        return layer_norm_distributed(x, w, b, epsilon=eps, group=self.replica_grouping)
