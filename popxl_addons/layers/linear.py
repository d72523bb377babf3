"""``Linear``: ``y = x @ weight + bias``."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

import popxl

from ..module import Module
from ..named_tensors import NamedTensors
from ..utils import WeightsDict
from ._mapping import has_bias, to_numpy
from .init import truncated_normal


class Linear(Module):
    """A fully connected layer on the last axis of its input.

    Variables (in creation order): ``weight`` of shape ``(x.shape[-1], out_features)``,
    truncated-normal (std 0.02, cut at 2 std) in ``x``'s dtype; then ``bias``, zeros of
    shape ``(out_features,)``, if ``bias``.

    Args:
        out_features: the size of the output's last axis.
        bias: add a bias.
        replica_grouping: the variables' replica grouping; with several groups (tensor
            parallelism) each group draws its own weight and the host arrays gain a leading
            ``num_groups`` axis.

    See also ``torch.nn.Linear`` (whose weight is the transpose of this one).
    """

    def __init__(
        self,
        out_features: int,
        bias: bool = True,
        replica_grouping: popxl.ReplicaGrouping | None = None,
    ) -> None:
        super().__init__()
        self.out_features = out_features
        self.bias = bias
        self.replica_grouping = replica_grouping

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        shape = (x.shape[-1], self.out_features)
        w = self.add_variable_input(
            "weight",
            partial(truncated_normal, shape),
            x.dtype,
            replica_grouping=self.replica_grouping,
        )
        y = x @ w
        if self.bias:
            b = self.add_variable_input(
                "bias",
                partial(np.zeros, (self.out_features,)),
                x.dtype,
                replica_grouping=self.replica_grouping,
            )
            y = y + b
        return y

    @staticmethod
    def torch_mapping(
        variables: NamedTensors, nn_layer: Any, dtype: popxl.dtype = popxl.float32
    ) -> WeightsDict:
        """Host values for ``variables`` from a ``torch.nn.Linear`` (its weight transposed)."""
        weights = WeightsDict({variables.weight: to_numpy(nn_layer.weight, dtype).T})
        if "bias" in variables.keys() and has_bias(nn_layer):
            weights[variables.bias] = to_numpy(nn_layer.bias, dtype)
        return weights


__all__ = ["Linear"]
