"""``GroupNorm``: normalise groups of channels of an ``(N, C, *)`` input."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

import popxl
from popxl import ops

from ..module import Module
from ..named_tensors import NamedTensors
from ..utils import WeightsDict
from ._mapping import to_numpy


class GroupNorm(Module):
    """Group normalisation (``ops.group_norm``) of an ``(N, C, *)`` input.

    Variables (in creation order): ``weight`` = ones(C), ``bias`` = zeros(C), in ``x``'s dtype.

    Args:
        num_groups: how many consecutive channel groups ``C`` splits into.
        replica_grouping: the variables' replica grouping.
        eps: added to the variance.
        cache: reuse the graph for inputs of the same spec (see ``Module``).

    See also ``torch.nn.GroupNorm(num_groups, C)``.
    """

    def __init__(
        self,
        num_groups: int,
        replica_grouping: popxl.ReplicaGrouping | None = None,
        eps: float = 1e-5,
        cache: bool = False,
    ) -> None:
        super().__init__(cache=cache)
        self.num_groups = num_groups
        self.replica_grouping = replica_grouping
        self.eps = eps

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        channels = x.shape[1]
        group = self.replica_grouping
        w = self.add_variable_input(
            "weight", partial(np.ones, (channels,)), x.dtype, replica_grouping=group
        )
        b = self.add_variable_input(
            "bias", partial(np.zeros, (channels,)), x.dtype, replica_grouping=group
        )
        return ops.group_norm(x, w, b, num_groups=self.num_groups, eps=self.eps)

    @staticmethod
    def torch_mapping(
        variables: NamedTensors, nn_layer: Any, dtype: popxl.dtype = popxl.float32
    ) -> WeightsDict:
        """Host values from a ``torch.nn.GroupNorm``."""
        return WeightsDict(
            {
                variables.weight: to_numpy(nn_layer.weight, dtype).reshape(-1),
                variables.bias: to_numpy(nn_layer.bias, dtype).reshape(-1),
            }
        )


__all__ = ["GroupNorm"]
