"""``Conv2D``: a 2-D convolution of NCHW inputs, with an optional bias."""

from __future__ import annotations

from functools import partial
from typing import Any, cast

import numpy as np

import popxl
from popxl import ops

from ..module import Module
from ..named_tensors import NamedTensors
from ..utils import WeightsDict
from ._mapping import has_bias, to_numpy
from .init import truncated_normal

PAD_TYPES = ("same_upper", "same_lower", "valid")
PADDING_MSG = (
    "Conv2D paddings must be 4 ints (top, left, bottom, right) or one of {modes}; got {value!r}."
)


class Conv2D(Module):
    """A 2-D convolution (``ops.conv``) of an ``(N, C, H, W)`` input.

    Variables (in creation order): ``weight`` of shape
    ``(out_channels, C / groups, kh, kw)``, truncated normal (std 0.02) in ``x``'s dtype;
    then ``bias``, zeros of shape ``(1, out_channels, 1, 1)``, if ``bias``.

    Args:
        out_channels: output channels.
        kernel_size: ``k`` (a ``k x k`` kernel) or ``(kh, kw)``.
        strides: ``(sh, sw)``.
        paddings: ``(top, left, bottom, right)``, or ``"same_upper"`` / ``"same_lower"``
            (pad so that ``out = ceil(in / stride)``, an odd total padding going at the
            end / beginning) or ``"valid"`` (no padding).
        dilations: ``(dh, dw)``.
        groups: channel groups; ``C`` and ``out_channels`` must divide by it.
        bias: add a bias.
        available_memory_proportions, partials_types, enable_conv_dithering: IPU planning
            options passed to ``ops.conv``; no effect here.
        replica_grouping: the variables' replica grouping.

    Unlike the original, ``build`` does not replace the ``bias`` flag with the bias tensor,
    so the same instance can build again.

    See also ``torch.nn.Conv2d``.
    """

    def __init__(
        self,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        strides: tuple[int, int] = (1, 1),
        paddings: tuple[int, int, int, int] | str = (0, 0, 0, 0),
        dilations: tuple[int, int] = (1, 1),
        groups: int = 1,
        bias: bool = True,
        available_memory_proportions: list[float] | None = None,
        partials_types: list[str] | None = None,
        enable_conv_dithering: list[int] | None = None,
        replica_grouping: popxl.ReplicaGrouping | None = None,
    ) -> None:
        super().__init__()
        self.out_channels = out_channels
        self.kernel_size = (
            (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        )
        self.strides = tuple(strides)
        self.pad_type: ops.PadType
        self.paddings: tuple[int, ...]
        if isinstance(paddings, str):
            if paddings not in PAD_TYPES:
                raise ValueError(PADDING_MSG.format(modes=PAD_TYPES, value=paddings))
            self.pad_type, self.paddings = cast(ops.PadType, paddings), (0, 0, 0, 0)
        else:
            if len(tuple(paddings)) != 4:
                raise ValueError(PADDING_MSG.format(modes=PAD_TYPES, value=paddings))
            self.pad_type, self.paddings = "not_set", tuple(paddings)
        self.dilations = tuple(dilations)
        self.groups = groups
        self.bias = bias
        self.available_memory_proportions = available_memory_proportions
        self.partials_types = partials_types
        self.enable_conv_dithering = enable_conv_dithering
        self.replica_grouping = replica_grouping

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        shape = (self.out_channels, x.shape[1] // self.groups, *self.kernel_size)
        group = self.replica_grouping
        w = self.add_variable_input(
            "weight", partial(truncated_normal, shape), x.dtype, replica_grouping=group
        )
        y = ops.conv(
            x,
            w,
            self.strides,
            self.paddings,
            self.dilations,
            self.groups,
            self.pad_type,
            self.available_memory_proportions,
            self.partials_types,
            self.enable_conv_dithering,
        )
        if self.bias:
            b = self.add_variable_input(
                "bias",
                partial(np.zeros, (1, self.out_channels, 1, 1)),
                x.dtype,
                replica_grouping=group,
            )
            y = y + b
        return y

    @staticmethod
    def torch_mapping(
        variables: NamedTensors, nn_layer: Any, dtype: popxl.dtype = popxl.float32
    ) -> WeightsDict:
        """Host values from a ``torch.nn.Conv2d`` (its ``(out,)`` bias reshaped to
        ``(1, out, 1, 1)``)."""
        weights = WeightsDict({variables.weight: to_numpy(nn_layer.weight, dtype)})
        if "bias" in variables.keys() and has_bias(nn_layer):
            weights[variables.bias] = to_numpy(nn_layer.bias, dtype).reshape(1, -1, 1, 1)
        return weights


__all__ = ["Conv2D"]
