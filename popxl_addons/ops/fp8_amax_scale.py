"""``fp8_amax_scale``: the float8 scaling bias from the absolute maximum of a tensor."""

from __future__ import annotations

import popxl
from popxl import ops

from .fp8_utils import float8_143_def, float8_152_def

_FORMATS = {"float8_143": float8_143_def, "float8_152": float8_152_def}


def _check_formats(src: popxl.Tensor, dtype: popxl.dtype) -> float:
    """The largest value of ``dtype``; raises like the original for other dtypes."""
    if src.dtype not in (popxl.float32, popxl.float16):
        raise RuntimeError(f"dtype {src.dtype} not currently supported.")
    if dtype.name not in _FORMATS:
        raise ValueError(f"dtype must be popxl.float8_143 or popxl.float8_152, got {dtype}.")
    return _FORMATS[dtype.name].max_value


def fp8_amax_scale(src: popxl.Tensor, dtype: popxl.dtype = popxl.float8_143) -> popxl.Tensor:
    """``clip(floor(log2(max_value(dtype) / max(|src|))), -31, 31)`` as an int32 scalar:
    the largest power-of-two scale that keeps ``src`` within the float8 range.

    Deliberate fix: the ratio is computed in float32. The original divided in ``src``'s
    dtype, so for float16 inputs below ``max_value / 65504`` (about 0.9 for float8_152) the
    ratio overflowed to infinity and the scale saturated at 31, overflowing the cast.

    Args:
        src: float16 or float32 tensor.
        dtype: ``popxl.float8_143`` (default) or ``popxl.float8_152``.

    Raises:
        RuntimeError: ``src`` is not float16 or float32.
        ValueError: ``dtype`` is not a float8 type.
    """
    largest = _check_formats(src, dtype)
    amax = ops.cast(ops.max(ops.abs(src)), popxl.float32)
    log2_max = ops.log2(popxl.constant(largest, popxl.float32) / amax)
    return ops.clip(ops.cast(ops.floor(log2_max), popxl.int32), -31, 31)


__all__ = ["fp8_amax_scale"]
