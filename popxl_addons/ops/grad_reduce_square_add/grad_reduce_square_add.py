"""``GradReduceSquareAdd``: ``sum(t ** 2) / loss_scaling ** 2`` in float32."""

from __future__ import annotations

from typing import Any

import popxl
from popxl.tensor_spec import TensorSpec

from .._native import define, float32, jnp, record


def _infer(t: Any, scale: Any) -> list:
    return [TensorSpec((), popxl.float32)]


def _lower(x: Any, scale: Any) -> Any:
    return jnp.sum(jnp.square(float32(x))) * scale.reshape(()).astype(jnp.float32)


GRAD_REDUCE_SQUARE_ADD = define("grad_reduce_square_add", "GradReduceSquareAdd", _infer, _lower)


def grad_reduce_square_add(
    t: popxl.Tensor, loss_scaling: int | float | popxl.Tensor
) -> popxl.Tensor:
    """Sum of squares of ``t`` divided by ``loss_scaling ** 2`` (a float32 scalar).

    For the norm of a loss-scaled gradient:
    ``grad_norm = ops.sqrt(grad_reduce_square_add(grad, loss_scaling=64))``.

    Args:
        t: the tensor to reduce (any float dtype; accumulated in float32).
        loss_scaling: the scaling of the values of ``t``: a number or a tensor.
    """
    scale = 1 / (loss_scaling * loss_scaling)
    if not isinstance(scale, popxl.Tensor):
        scale = popxl.constant(scale, popxl.float32)
    return record(GRAD_REDUCE_SQUARE_ADD, {"t": t, "loss_scaling": scale}, {}, ["grad_reduced"])[0]


__all__ = ["grad_reduce_square_add"]
