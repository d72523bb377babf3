"""``LayerNorm``: normalise each row of an ``(N, C)`` input."""

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

RANK_MSG = (
    "LayerNorm needs a rank-2 input (N, C) and normalises each row over C; got shape {shape}. "
    "Flatten the leading axes first, e.g. x.reshape((-1, x.shape[-1]))."
)


class LayerNorm(Module):
    """Layer normalisation of an ``(N, C)`` input (``ops.layer_norm``).

    Variables (in creation order): ``weight`` = ones(C), ``bias`` = zeros(C), in ``x``'s dtype.

    ``build(x, eps=1e-5)`` raises ``ValueError`` when ``x`` is not rank 2.

    See also ``torch.nn.LayerNorm(C)``.
    """

    def build(self, x: popxl.Tensor, eps: float = 1e-5) -> popxl.Tensor:
        if len(x.shape) != 2:
            raise ValueError(RANK_MSG.format(shape=tuple(x.shape)))
        channels = x.shape[-1]
        w = self.add_variable_input("weight", partial(np.ones, (channels,)), x.dtype)
        b = self.add_variable_input("bias", partial(np.zeros, (channels,)), x.dtype)
        return ops.layer_norm(x, w, b, eps=eps)

    @staticmethod
    def torch_mapping(
        variables: NamedTensors, nn_layer: Any, dtype: popxl.dtype = popxl.float32
    ) -> WeightsDict:
        """Host values from a ``torch.nn.LayerNorm`` (multi-dimensional params are flattened)."""
        return WeightsDict(
            {
                variables.weight: to_numpy(nn_layer.weight, dtype).reshape(-1),
                variables.bias: to_numpy(nn_layer.bias, dtype).reshape(-1),
            }
        )


__all__ = ["LayerNorm"]
