"""Neural-network ops: matmul, softmax and log_softmax.

Also home to the small helpers shared by the other neural-network op modules (``conv``,
``pool``, ``norm``, ``resize``): the float dtypes they accept, the float32 compute type and
the check of a string option against its choices.
"""

from __future__ import annotations

from typing import Any, TypeVar

from .. import dtypes
from .._op import AMP_HINT, core_error, define
from ..tensor import Tensor
from ._base import dot_precision, jax, jnp, normalize_axis, record, same_dtype, spec

_Choice = TypeVar("_Choice")

# matmul ----------------------------------------------------------------------------------


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if not a or not b:
        raise core_error(f"matmul needs inputs of rank >= 1, got shapes {a} and {b}.")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise core_error(
            f"matmul: the inner dimensions of {a} and {b} differ ({a2[-1]} != {b2[-2]})."
        )
    try:
        import numpy as np  # noqa: PLC0415

        batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError:
        raise core_error(f"matmul: batch dimensions of {a} and {b} do not broadcast.") from None
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _matmul_dtype(a: Any, b: Any) -> dtypes.dtype:
    """PopART's MatMul took the left operand's dtype without comparing it with the right
    one's; a float16/float32 mix therefore computes in the left dtype. Other mixes (integer
    by float) are refused, as no IPU matmul accepted them."""
    if a.dtype is not b.dtype and {a.dtype, b.dtype} <= set(FLOATS):
        return a.dtype
    return same_dtype("MatMul", a, b)


def _matmul_infer(a: Any, b: Any, *, output_type: dtypes.dtype | None, partials_type: Any) -> list:
    return [spec(_matmul_shape(a.shape, b.shape), output_type or _matmul_dtype(a, b))]


def _matmul(x: Any, y: Any, *, output_type: Any, partials_type: Any) -> Any:
    y = y.astype(x.dtype)
    accumulate = jnp.float32 if partials_type is dtypes.float32 or partials_type is None else None
    if x.dtype == jnp.float16 and accumulate is not None:
        return jnp.matmul(x, y, preferred_element_type=accumulate).astype(x.dtype)
    return jnp.matmul(x, y, precision=dot_precision(x.dtype))


MATMUL = define("matmul", "MatMul", _matmul_infer, _matmul, grad_needs="others")


def matmul(
    lhs: Tensor,
    rhs: Tensor,
    available_memory_proportion: float | None = None,
    output_type: dtypes.dtype | None = None,
    partials_type: dtypes.dtype | None = None,
) -> Tensor:
    """Matrix product with NumPy ``matmul`` rules (1-D promotion, batch broadcasting).

    Args:
        lhs, rhs: inputs of the same dtype, or one float16 and one float32: then, as in
            PopART, the product is computed in (and has) ``lhs``'s dtype.
        available_memory_proportion: an IPU tiling hint, recorded on the op
            (``op.hints``); XLA plans memory itself, so it has no effect on the result.
        output_type: dtype of the result (default: ``lhs``'s dtype).
        partials_type: accumulation type, ``float32`` (default) or ``float16``.

    Raises:
        ValueError: a ``partials_type`` other than float16/float32.
        PopXLException: mismatched inner dimensions, or dtypes that differ other than
            float16/float32.
    """
    if partials_type is not None and partials_type not in (dtypes.float16, dtypes.float32):
        raise ValueError(f"partials_type must be float16 or float32, got {partials_type}.")
    attrs = {"output_type": output_type, "partials_type": partials_type}
    out = record(MATMUL, {"lhs": lhs, "rhs": rhs}, attrs, ["matmul_out"])[0]
    if available_memory_proportion is not None and out._producer is not None:
        out._producer.hints[AMP_HINT] = float(available_memory_proportion)
    return out


# softmax ---------------------------------------------------------------------------------


def _axis_infer(t: Any, *, axis: int) -> list:
    return [t]


def softmax_grad(y: Any, dy: Any, *, axis: int, **_: Any) -> Any:
    """Softmax's input gradient from its output ``y`` and the output's cotangent."""
    return y * (dy - jnp.sum(y * dy, axis=axis, keepdims=True))


SOFTMAX = define(
    "softmax",
    "Softmax",
    _axis_infer,
    lambda x, *, axis: jax.nn.softmax(x, axis=axis),
    grad_from_output=softmax_grad,
)
LOG_SOFTMAX = define(
    "log_softmax", "LogSoftmax", _axis_infer, lambda x, *, axis: jax.nn.log_softmax(x, axis=axis)
)


def softmax(t: Tensor, axis: int) -> Tensor:
    """Softmax along ``axis`` (required; negative axes count from the end)."""
    return record(SOFTMAX, {"t": t}, {"axis": normalize_axis(axis, t.rank)}, ["softmax_out"])[0]


def log_softmax(t: Tensor, axis: int) -> Tensor:
    """``log(softmax(t, axis))``, computed stably (an addition to the original op set)."""
    attrs = {"axis": normalize_axis(axis, t.rank)}
    return record(LOG_SOFTMAX, {"t": t}, attrs, ["log_softmax_out"])[0]


# Helpers shared by the conv, pool, norm and resize modules ------------------------------

FLOATS = (dtypes.float16, dtypes.float32)


def _check_choice(value: _Choice, choices: tuple[str, ...], message: str) -> _Choice:
    if value not in choices:
        raise ValueError(message.format(value))
    return value


def _compute_type(x: Any) -> Any:
    """float32 for float16 (and integer) data: statistics and weighted sums keep precision."""
    return jnp.promote_types(x.dtype, jnp.float32)
