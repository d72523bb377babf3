"""Float8 ops: scaled casts to and from float8, and the scaled float8 matmul.

Float8 values carry a power-of-two scale held in an int32 scalar tensor ``log2_scale``:
casting to float8 multiplies by ``2**log2_scale`` first, casting back and the matmul multiply
their result by it. Scaling is exact (``ldexp``) and happens in float32. Scales must lie in
``[-32, 32)``: as in PopXL, a run whose scale leaves that range raises
``popxl.errors.Error`` while the session option ``throwIfLog2ScaleTensorNotInRange`` is on
(the default; see ``runtime/lowering/checks.py``); with it off the scale is applied as is. Float8
ops have no gradient (not for training). Every op here takes ``log2_scale`` as its last
input (the run-time check relies on it).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes

from .. import context, dtypes
from .._op import define
from ..tensor import Tensor
from ._base import check_in_graph, jnp, lax, record, spec
from .nn import _matmul_shape

FLOAT8 = (dtypes.float8_143, dtypes.float8_152)
FROM_FP8_TARGETS = (dtypes.float16, dtypes.float32)
TO_FP8_SOURCES = (dtypes.float16, dtypes.float32)

NOT_FP8_TARGET_MSG = (
    "pow2scale_cast_to_fp8: data_type must be popxl.float8_143 or popxl.float8_152, got "
    "{got}. For other dtypes use ops.cast."
)
NOT_FP8_SOURCE_MSG = (
    "pow2scale_cast_to_fp8: the input must be float16 or float32, got {got}. Cast it with "
    "ops.cast first."
)
NOT_FP8_INPUT_MSG = (
    "{op}: {what} must have a float8 dtype (popxl.float8_143 or popxl.float8_152), got {got}. "
    "Convert it with ops.pow2scale_cast_to_fp8 first."
)
BAD_FROM_TARGET_MSG = (
    "pow2scale_cast_from_fp8: data_type must be popxl.float16 or popxl.float32, got {got}."
)
SCALE_SHAPE_MSG = (
    "Log2 scale argument must be a scalar tensor: {op} got log2_scale of shape {got}. "
    "Reshape it, e.g. ops.reshape(log2_scale, ())."
)
SCALE_DTYPE_MSG = (
    "Log2 scale tensor must be of type popxl.int32: {op} got log2_scale of dtype {got}. "
    "Cast it with ops.cast(log2_scale, popxl.int32)."
)


def _check_log2_scale(op: str, log2_scale: Tensor) -> None:
    if log2_scale.shape != ():
        raise ValueError(SCALE_SHAPE_MSG.format(op=op, got=log2_scale.shape))
    if log2_scale.dtype != dtypes.int32:
        raise TypeError(SCALE_DTYPE_MSG.format(op=op, got=log2_scale.dtype.name))


def _scaled_f32(x: Any, log2_scale: Any) -> Any:
    return jnp.ldexp(x.astype(jnp.float32), log2_scale.astype(jnp.int32))


# pow2scale_cast_to_fp8 ---------------------------------------------------------------------


def _cast_infer(t: Any, log2_scale: Any, *, data_type: dtypes.dtype) -> list:
    return [spec(t.shape, data_type, t.meta_shape)]


def _lower_pow2scale_then_cast(x: Any, log2_scale: Any, *, data_type: dtypes.dtype) -> Any:
    target = data_type._np_device
    scaled = _scaled_f32(x, log2_scale)
    # Out-of-range values become NaN (the float8 formats have no infinity), as on the IPU.
    limit = float(ml_dtypes.finfo(target).max)
    return jnp.where(jnp.abs(scaled) > limit, jnp.nan, scaled).astype(target)


POW2SCALE_THEN_CAST = define(
    "pow2scale_cast_to_fp8",
    "Pow2ScaleThenCast",
    _cast_infer,
    _lower_pow2scale_then_cast,
    grad="none",
    special="log2_scale_checked",
)


def pow2scale_cast_to_fp8(t: Tensor, log2_scale: Tensor, data_type: dtypes.dtype) -> Tensor:
    """``cast(t * 2**log2_scale, data_type)`` for a float8 ``data_type``.

    The input is float16 or float32; values whose scaled magnitude exceeds the format's
    largest value (240 for float8_143, 57344 for float8_152) become NaN, matching
    ``popxl.fp8_utils.host_pow2scale_cast_to_fp8(..., nan_on_overflow=True)``. Other values
    round to nearest even. The output keeps ``t``'s shape. No gradient.

    Args:
        t: float16 or float32 tensor.
        log2_scale: int32 scalar tensor.
        data_type: ``popxl.float8_143`` or ``popxl.float8_152``.

    Returns:
        The float8 tensor, named ``<t.name>_<data_type.name>``.

    Raises:
        TypeError: a non-float8 ``data_type``, a ``t`` that is not float16/float32 or a
            ``log2_scale`` that is not int32.
        ValueError: a ``log2_scale`` that is not a scalar.
    """
    check_in_graph(context.get_current_graph(), t=t, log2_scale=log2_scale)
    if data_type not in FLOAT8:
        raise TypeError(NOT_FP8_TARGET_MSG.format(got=data_type))
    if t.dtype not in TO_FP8_SOURCES:
        raise TypeError(NOT_FP8_SOURCE_MSG.format(got=t.dtype.name))
    _check_log2_scale("pow2scale_cast_to_fp8", log2_scale)
    inputs = {"t": t, "log2_scale": log2_scale}
    name = f"{t.name}_{data_type.name}"
    return record(POW2SCALE_THEN_CAST, inputs, {"data_type": data_type}, [name])[0]


# pow2scale_cast_from_fp8 -------------------------------------------------------------------


def _lower_cast_then_pow2scale(x: Any, log2_scale: Any, *, data_type: dtypes.dtype) -> Any:
    return _scaled_f32(x, log2_scale).astype(data_type._np_device)


CAST_THEN_POW2SCALE = define(
    "pow2scale_cast_from_fp8",
    "CastThenPow2Scale",
    _cast_infer,
    _lower_cast_then_pow2scale,
    grad="none",
    special="log2_scale_checked",
)


def pow2scale_cast_from_fp8(t: Tensor, log2_scale: Tensor, data_type: dtypes.dtype) -> Tensor:
    """``cast(t, data_type) * 2**log2_scale`` for a float8 ``t``.

    Every float8 value is exact in float16/float32; the scaling is exact unless the result
    leaves ``data_type``'s range (then it is inf or flushes towards 0). No gradient.

    Args:
        t: float8 tensor (``float8_143`` or ``float8_152``).
        log2_scale: int32 scalar tensor.
        data_type: ``popxl.float16`` or ``popxl.float32``.

    Returns:
        The converted tensor, named ``<t.name>_<data_type.name>``.

    Raises:
        TypeError: a ``t`` that is not float8, another ``data_type``, or a ``log2_scale`` that
            is not int32.
        ValueError: a ``log2_scale`` that is not a scalar.
    """
    op = "pow2scale_cast_from_fp8"
    check_in_graph(context.get_current_graph(), t=t, log2_scale=log2_scale)
    if data_type not in FROM_FP8_TARGETS:
        raise TypeError(BAD_FROM_TARGET_MSG.format(got=data_type))
    if t.dtype not in FLOAT8:
        raise TypeError(NOT_FP8_INPUT_MSG.format(op=op, what="the input", got=t.dtype.name))
    _check_log2_scale(op, log2_scale)
    inputs = {"t": t, "log2_scale": log2_scale}
    name = f"{t.name}_{data_type.name}"
    return record(CAST_THEN_POW2SCALE, inputs, {"data_type": data_type}, [name])[0]


# matmul_pow2scaled -------------------------------------------------------------------------


def _matmul_infer(lhs: Any, rhs: Any, log2_scale: Any) -> list:
    return [spec(_matmul_shape(lhs.shape, rhs.shape), dtypes.float16)]


def _lower_matmul_pow2scaled(lhs: Any, rhs: Any, log2_scale: Any) -> Any:
    product = jnp.matmul(
        lhs.astype(jnp.float32),
        rhs.astype(jnp.float32),
        precision=lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )
    return _scaled_f32(product, log2_scale).astype(jnp.float16)


MATMUL_POW2SCALED = define(
    "matmul_pow2scaled",
    "MatMul",
    _matmul_infer,
    _lower_matmul_pow2scaled,
    grad="none",
    special="log2_scale_checked",
)


def matmul_pow2scaled(
    lhs: Tensor,
    rhs: Tensor,
    log2_scale: Tensor,
    available_memory_proportion: float | None = None,
) -> Tensor:
    """Float8 matrix product scaled by ``2**log2_scale``, returned as float16.

    ``(lhs @ rhs) * 2**log2_scale`` with NumPy ``matmul`` shape rules, accumulated in float32
    and rounded to float16 once. The operands may use different float8 formats. No gradient.

    Args:
        lhs, rhs: float8 tensors (``float8_143`` or ``float8_152``).
        log2_scale: int32 scalar tensor.
        available_memory_proportion: an IPU tiling hint; no effect here.

    Returns:
        The float16 product, named ``matmul_pow2scaled_out``.

    Raises:
        TypeError: an operand that is not float8 or a ``log2_scale`` that is not int32.
        ValueError: a ``log2_scale`` that is not a scalar.
        PopXLException: operands whose inner or batch dimensions do not match.
    """
    del available_memory_proportion
    op = "matmul_pow2scaled"
    check_in_graph(context.get_current_graph(), lhs=lhs, rhs=rhs, log2_scale=log2_scale)
    for what, t in (("lhs", lhs), ("rhs", rhs)):
        if t.dtype not in FLOAT8:
            raise TypeError(NOT_FP8_INPUT_MSG.format(op=op, what=what, got=t.dtype.name))
    _check_log2_scale(op, log2_scale)
    inputs = {"lhs": lhs, "rhs": rhs, "log2_scale": log2_scale}
    return record(MATMUL_POW2SCALED, inputs, {}, ["matmul_pow2scaled_out"])[0]
