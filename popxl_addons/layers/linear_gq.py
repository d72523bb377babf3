"""``LinearGQ``: a linear layer with 4-bit group-quantised weights (FlexGen)."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

import popxl

from ..module import Module
from ..named_tensors import NamedTensors
from ..ops.group_quantize_decompress import (
    group_quantize_compress_numpy,
    group_quantize_decompress,
)
from ..utils import WeightsDict
from ._mapping import has_bias, to_numpy

DIM_MSG = "LinearGQ quantises the weight along dim 0, 1 or -1, got dim={dim}."
GROUP_MSG = (
    "LinearGQ: the quantised axis has {n} elements, which is not a multiple of "
    "group_size={group} (itself a multiple of 4)."
)


class LinearGQ(Module):
    """``y = x @ decompress(weight) + bias`` with the weight stored 4-bit group-quantised.

    Variables: ``weight_compressed`` uint16 ``(kept, quantised // group_size,
    group_size // 4)``, ``weight_decompression_scale`` and ``weight_decompression_bias``
    ``(kept, quantised // group_size, 1)`` in ``x``'s dtype (zeros: write real values, e.g.
    with ``torch_mapping``), then ``bias`` zeros ``(out_features,)`` if ``bias``. With
    ``dim`` 1 or -1 the output axis of the weight is quantised, with 0 the input axis.

    Args:
        out_features: size of the output's last axis.
        bias: add a bias.
        replica_grouping: the variables' replica grouping.
        group_size: elements per quantisation group.
        dim: the weight axis that is quantised.

    Raises:
        ValueError: bad ``dim`` or ``group_size`` (when building).
    """

    def __init__(
        self,
        out_features: int,
        bias: bool = True,
        replica_grouping: popxl.ReplicaGrouping | None = None,
        group_size: int = 0,
        dim: int = -1,
    ) -> None:
        super().__init__()
        self.out_features = out_features
        self.bias = bias
        self.replica_grouping = replica_grouping
        self.group_size = group_size
        self.dim = dim

    def _layout(self, in_features: int) -> tuple[int, int]:
        """(kept axis size, quantised axis size) of the weight."""
        if self.dim not in (0, 1, -1):
            raise ValueError(DIM_MSG.format(dim=self.dim))
        kept, quantised = (
            (in_features, self.out_features) if self.dim != 0 else (self.out_features, in_features)
        )
        if self.group_size <= 0 or self.group_size % 4 or quantised % self.group_size:
            raise ValueError(GROUP_MSG.format(n=quantised, group=self.group_size))
        return kept, quantised

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        kept, quantised = self._layout(x.shape[-1])
        groups = quantised // self.group_size
        variable = partial(self.add_variable_input, replica_grouping=self.replica_grouping)
        packed = variable(
            "weight_compressed",
            partial(np.zeros, (kept, groups, self.group_size // 4)),
            popxl.uint16,
        )
        scale = variable(
            "weight_decompression_scale", partial(np.zeros, (kept, groups, 1)), x.dtype
        )
        offset = variable(
            "weight_decompression_bias", partial(np.zeros, (kept, groups, 1)), x.dtype
        )
        y = x @ group_quantize_decompress(packed, scale, offset, self.dim)
        if self.bias:
            b = variable("bias", partial(np.zeros, y.shape[-1]), x.dtype)
            y = y + b
        return y

    @staticmethod
    def torch_mapping(
        variables: NamedTensors,
        nn_layer: Any,
        dtype: popxl.dtype = popxl.float32,
        group_size: int = 64,
        dim: int = -1,
    ) -> WeightsDict:
        """Host values from a ``torch.nn.Linear``: its (transposed) weight compressed with
        ``group_quantize_compress_numpy``, and its bias."""
        weight = to_numpy(nn_layer.weight, popxl.float32).T
        packed, scale, offset = group_quantize_compress_numpy(weight, group_size, dim=dim)
        weights = WeightsDict(
            {
                variables.weight_compressed: packed,
                variables.weight_decompression_scale: scale,
                variables.weight_decompression_bias: offset,
            }
        )
        if "bias" in variables.keys() and has_bias(nn_layer):
            weights[variables.bias] = to_numpy(nn_layer.bias, dtype)
        return weights


__all__ = ["LinearGQ"]
