"""``LinearFP8``: a linear layer whose matmuls run in float8 with power-of-two scales."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import popxl
from popxl import ops

from ..module import Module
from ..ops.fp8_amax_scale import fp8_amax_scale
from ..ops.fp8_mse_scale import fp8_mse_scale
from .init import truncated_normal
from .linear import Linear

SCALE_METRIC_MSG = (
    "The scale_metric option {metric} is not available. "
    "Please provide one of the following options: amax, mse or manual_scale."
)
GRAD_MARGIN = 3  # the gradient's scale is lowered by this much to leave room in the matmul


class LinearFP8(Module):
    """``y = x @ weight + bias`` with ``x``, ``weight`` and the output gradient cast to
    float8 (``float8_143`` forward, ``float8_152`` for gradients), each with its own
    power-of-two scale, and ``matmul_pow2scaled`` undoing the scales.

    Variables: ``weight`` ``(x.shape[-1], out_features)`` truncated normal (std 0.02), then
    ``bias`` zeros ``(out_features,)`` if ``bias``, in ``x``'s dtype.

    Args:
        out_features: size of the output's last axis.
        bias: add a bias.
        scale_metric: how each scale is chosen: ``"amax"`` (``fp8_amax_scale``), ``"mse"``
            (``fp8_mse_scale``) or ``"manual_scale"`` (the constant ``scale``).
        scale: the log2 scale for ``"manual_scale"``.
        replica_grouping: the variables' replica grouping.

    Raises:
        ValueError: unknown ``scale_metric``.
    """

    def __init__(
        self,
        out_features: int,
        bias: bool = True,
        scale_metric: str = "amax",
        scale: int = 0,
        replica_grouping: popxl.ReplicaGrouping | None = None,
    ) -> None:
        super().__init__()
        self.out_features = out_features
        self.bias = bias
        self.replica_grouping = replica_grouping
        self.scale_metric = scale_metric
        self.scale = scale
        self.forward_fp8_type = popxl.float8_143
        self.grad_fp8_type = popxl.float8_152
        self.fp8_scale = self._scale_function(scale_metric)

    def _scale_function(self, metric: str) -> Callable[[popxl.Tensor, popxl.dtype], Any]:
        functions: dict[str, Callable[[popxl.Tensor, popxl.dtype], Any]] = {
            "amax": fp8_amax_scale,
            "mse": fp8_mse_scale,
            "manual_scale": lambda x, dtype: popxl.constant(self.scale),
        }
        if metric not in functions:
            raise ValueError(SCALE_METRIC_MSG.format(metric=metric))
        return functions[metric]

    def _cast(self, t: popxl.Tensor, dtype: popxl.dtype, margin: int = 0) -> tuple:
        log2_scale = self.fp8_scale(t, dtype)
        if margin:
            log2_scale = ops.clip(log2_scale - popxl.constant(margin), -31, 31)
        return log2_scale, ops.pow2scale_cast_to_fp8(t, data_type=dtype, log2_scale=log2_scale)

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input(
            "weight",
            partial(truncated_normal, (x.shape[-1], self.out_features)),
            x.dtype,
            replica_grouping=self.replica_grouping,
        )
        w_log2scale, w_fp8 = self._cast(w, self.forward_fp8_type)
        x_log2scale, x_fp8 = self._cast(x, self.forward_fp8_type)
        self.aux["w_log2scale"] = w_log2scale
        self.aux["w_fp8"] = w_fp8
        self.aux["x_log2scale"] = x_log2scale
        self.aux["x_fp8"] = x_fp8
        y = ops.matmul_pow2scaled(x_fp8, w_fp8, log2_scale=-w_log2scale - x_log2scale)
        if x.dtype == popxl.float32:  # the float8 matmul returns float16
            y = ops.cast(y, popxl.float32)
        if self.bias:
            b = self.add_variable_input(
                "bias",
                partial(np.zeros, y.shape[-1]),
                x.dtype,
                replica_grouping=self.replica_grouping,
            )
            y = y + b
        return y

    def build_grad(self, dLdy: popxl.Tensor) -> popxl.Tensor:  # type: ignore[override]  # noqa: N803
        """The backward pass with float8 matmuls: ``dx``, and ``var_grad`` for the weight
        and the bias."""
        dy_log2scale, dy_fp8 = self._cast(dLdy, self.grad_fp8_type, GRAD_MARGIN)
        dx = ops.matmul_pow2scaled(
            dy_fp8, self.aux["w_fp8"].T, log2_scale=-self.aux["w_log2scale"] - dy_log2scale
        )
        dw = ops.matmul_pow2scaled(
            dy_fp8.T, self.aux["x_fp8"], log2_scale=-self.aux["x_log2scale"] - dy_log2scale
        ).T
        self.var_grad["weight"] = dw
        if self.bias:
            self.var_grad["bias"] = ops.sum(dLdy, 0)
        return dx

    # The same variables as ``Linear`` (a weight, maybe a bias): the same torch mapping.
    torch_mapping = staticmethod(Linear.torch_mapping)


__all__ = ["LinearFP8"]
