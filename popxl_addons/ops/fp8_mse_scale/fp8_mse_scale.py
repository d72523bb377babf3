"""``Fp8Scale``: the float8 scaling bias with the smallest estimated cast error (MSE).

The device side of ``popxl.fp8_utils.host_fp8_mse_scale``: a histogram of the binary
exponents of ``|src|``, one matrix-vector product with the shared cost factors
(``popxl._fp8_scale``), and the middle of the cheapest candidates.
"""

from __future__ import annotations

from typing import Any

import popxl
from popxl import _fp8_scale as scale_table
from popxl.tensor_spec import TensorSpec

from .._native import define, jnp, record
from ..fp8_amax_scale import _check_formats


def _infer(src: Any, **_: Any) -> list:
    return [TensorSpec((), popxl.int32)]


def _exponent_bins(magnitude: Any) -> Any:
    _, exponent = jnp.frexp(magnitude)
    bins = jnp.clip(exponent - scale_table.SRC_MIN_EXP, 0, scale_table.BINS)
    return jnp.where(magnitude < 2.0**scale_table.SRC_MIN_EXP, 0, bins)


def _middle_of_best(costs: Any) -> Any:
    best = costs == jnp.min(costs)
    rank = jnp.cumsum(best) - 1
    middle = jnp.sum(best) // 2
    return jnp.argmax(best & (rank == middle))


def _lower(src: Any, *, source: str, dest: str) -> Any:
    magnitude = jnp.abs(src.reshape(-1).astype(jnp.float32))
    counts = jnp.zeros(scale_table.BINS + 1, jnp.float32).at[_exponent_bins(magnitude)].add(1.0)
    hist = counts[1:] / magnitude.size
    # Weights relative to the largest occupied bin keep float32 in range; bins far below
    # it underflow to zero, which cannot change which candidate is cheapest.
    top = jnp.max(jnp.where(hist > 0, jnp.arange(scale_table.BINS), 0))
    below = jnp.minimum(jnp.arange(scale_table.BINS) - top, 0).astype(jnp.float32)
    weights = jnp.exp2(2.0 * below)
    factors = jnp.asarray(scale_table.cost_factors(source, dest), jnp.float32)
    costs = factors @ (weights * hist)
    return (-(scale_table.MIN_SCALING_BIAS + _middle_of_best(costs))).astype(jnp.int32)


FP8_MSE_SCALE = define("fp8_mse_scale", "Fp8Scale", _infer, _lower, grad="none")


def fp8_mse_scale(src: popxl.Tensor, dtype: popxl.dtype = popxl.float8_143) -> popxl.Tensor:
    """The scaling bias (int32 scalar) that casts ``src`` to ``dtype`` with the smallest
    estimated squared error, as ``popxl.fp8_utils.host_fp8_mse_scale`` computes on the host.

    Args:
        src: float16 or float32 tensor.
        dtype: ``popxl.float8_143`` (default) or ``popxl.float8_152``.

    Raises:
        RuntimeError: ``src`` is not float16 or float32.
        ValueError: ``dtype`` is not a float8 type.
    """
    _check_formats(src, dtype)
    attrs = {"source": src.dtype.name, "dest": dtype.name}
    return record(FP8_MSE_SCALE, {"src": src.flatten()}, attrs, ["scaling_bias"])[0]


__all__ = ["fp8_mse_scale"]
