"""Reductions: sum/mean/max/... over axes, arg-reductions, cumsum, topk, lamb_square, histogram.

The axis reductions (``sum``, ``mean``, ``prod``, ``max``, ``min``, ``median``, ``sumsquare``,
``l1``, ``l2``, ``logsum``, ``logsumexp``) are one table of op kinds sharing one inference
rule. They keep the input dtype: integer inputs give integer results (``mean`` truncates
toward zero), and float16 inputs are accumulated in float32 and rounded back to float16.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .. import dtypes
from .._op import OpDef, define
from ..tensor import Tensor, constant
from ._base import jax, jnp, lax, normalize_axes, normalize_axis, record, spec
from .elementwise import jax_abs

AXIS_TYPE_MSG = (
    "{op}: `axis` must be None, an int or an iterable of ints, got {value!r}. Pass e.g. "
    "axis=0 or axis=[0, -1]."
)

# Axis reductions --------------------------------------------------------------------------


def _reduced_shape(shape: Sequence[int], axes: tuple[int, ...], keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def _reduce_infer(t: Any, *, axis: tuple[int, ...], keepdims: bool) -> list:
    return [spec(_reduced_shape(t.shape, axis, keepdims), t.dtype)]


def _compute_dtype(dtype: Any, float_math: bool) -> Any:
    """Accumulate half precision in float32; ops built on log/sqrt need floats for ints."""
    if dtype in (jnp.float16, jnp.bfloat16):
        return jnp.float32
    if float_math and not jnp.issubdtype(dtype, jnp.floating):
        return jnp.float32
    return dtype


def _mean(x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.mean(x, axis=axis, keepdims=keepdims)
    total = jnp.sum(x, axis=axis, keepdims=keepdims, dtype=x.dtype)
    count = int(np.prod([x.shape[d] for d in axis]))
    return lax.div(total, jnp.asarray(count, x.dtype))  # truncates toward zero


def _median(x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    kept = [d for d in range(x.ndim) if d not in axis]
    rows = jnp.transpose(x, kept + list(axis)).reshape([x.shape[d] for d in kept] + [-1])
    n = rows.shape[-1]
    # The lower median, as torch.median: no averaging, so the result is an input element.
    out = jnp.sort(rows, axis=-1)[..., (n - 1) // 2]
    return out.reshape(_reduced_shape(x.shape, axis, keepdims))


def _sum_of(values: Any, x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    return jnp.sum(values, axis=axis, keepdims=keepdims, dtype=x.dtype)


def _logsumexp(x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    return jax.nn.logsumexp(x, axis=axis, keepdims=keepdims)


# name: (PopXL type, fn(x, axes, keepdims), needs float math for integer inputs)
REDUCTIONS: dict[str, tuple[str, Any, bool]] = {
    "sum": ("ReduceSum", lambda x, a, k: _sum_of(x, x, a, k), False),
    "mean": ("ReduceMean", _mean, False),
    "prod": ("ReduceProd", lambda x, a, k: jnp.prod(x, axis=a, keepdims=k, dtype=x.dtype), False),
    "max": ("ReduceMax", lambda x, a, k: jnp.max(x, axis=a, keepdims=k), False),
    "min": ("ReduceMin", lambda x, a, k: jnp.min(x, axis=a, keepdims=k), False),
    "median": ("ReduceMedian", _median, False),
    "sumsquare": ("ReduceSumSquare", lambda x, a, k: _sum_of(x * x, x, a, k), False),
    "l1": ("ReduceL1", lambda x, a, k: _sum_of(jax_abs(x), x, a, k), False),
    "l2": ("ReduceL2", lambda x, a, k: jnp.sqrt(_sum_of(x * x, x, a, k)), True),
    "logsum": ("ReduceLogSum", lambda x, a, k: jnp.log(_sum_of(x, x, a, k)), True),
    "logsumexp": ("ReduceLogSumExp", _logsumexp, True),
}


def _reduction_lowering(fn: Any, float_math: bool) -> Any:
    def lower(x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
        compute = _compute_dtype(x.dtype, float_math)
        return fn(x.astype(compute), axis, keepdims).astype(x.dtype)

    return lower


OPS: dict[str, OpDef] = {
    name: define(name, type_name, _reduce_infer, _reduction_lowering(fn, float_math))
    for name, (type_name, fn, float_math) in REDUCTIONS.items()
}


def _check_axes(op: str, t: Tensor, axis: Any) -> tuple[int, ...]:
    if axis is None:
        return normalize_axes(None, t.rank)
    axes = [axis] if isinstance(axis, (int, np.integer)) else axis
    try:
        axes = list(axes)
    except TypeError:
        raise TypeError(AXIS_TYPE_MSG.format(op=op, value=axis)) from None
    if not all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in axes):
        raise TypeError(AXIS_TYPE_MSG.format(op=op, value=axis))
    return normalize_axes(axes, t.rank)


def _reduce(name: str, t: Tensor, axis: Any, keepdims: bool) -> Tensor:
    attrs = {"axis": _check_axes(name, t, axis), "keepdims": bool(keepdims)}
    return record(OPS[name], {"t": t}, attrs, [f"{name}_out"])[0]


def sum(  # noqa: A001 (public API name)
    t: Tensor, axis: int | Iterable[int] | None = None, keepdims: bool = False
) -> Tensor:
    """Sum of ``t`` over ``axis``.

    ``axis=None`` reduces every axis (a scalar unless ``keepdims``); an int reduces one axis;
    negative axes count from the end; an empty list reduces nothing. With ``keepdims`` the
    reduced axes stay as size-1 dimensions. The result has ``t``'s dtype. The same axis rules
    hold for every reduction in this module. See also ``numpy.sum``.

    Raises:
        TypeError: ``axis`` is not None, an int or an iterable of ints.
        ValueError: an axis is out of range for ``t``'s rank.
    """
    return _reduce("sum", t, axis, keepdims)


def mean(t: Tensor, axis: int | Iterable[int] | None = None, keepdims: bool = False) -> Tensor:
    """Arithmetic mean over ``axis`` (axis rules as ``sum``); integer means truncate toward 0."""
    return _reduce("mean", t, axis, keepdims)


def prod(t: Tensor, axis: int | Iterable[int] | None = None, keepdims: bool = False) -> Tensor:
    """Product over ``axis`` (axis rules as ``sum``)."""
    return _reduce("prod", t, axis, keepdims)


def max(  # noqa: A001 (public API name)
    t: Tensor, axis: int | Iterable[int] | None = None, keepdims: bool = False
) -> Tensor:
    """Maximum over ``axis`` (axis rules as ``sum``). For the elementwise max see ``maximum``.

    The gradient is only well defined without ties (JAX splits it evenly between them).
    """
    return _reduce("max", t, axis, keepdims)


def min(  # noqa: A001 (public API name)
    t: Tensor, axis: int | Iterable[int] | None = None, keepdims: bool = False
) -> Tensor:
    """Minimum over ``axis`` (axis rules as ``sum``); gradients are well defined without ties."""
    return _reduce("min", t, axis, keepdims)


def median(t: Tensor, axis: int | Iterable[int] | None = None, keepdims: bool = False) -> Tensor:
    """Median over ``axis`` (axis rules as ``sum``).

    For an even number of elements this is the LOWER median (element ``(n - 1) // 2`` of the
    sorted values), as ``torch.median``; ``numpy.median`` would average the two middle values.
    The result is always an element of ``t``, so integer inputs stay exact. The gradient goes
    to the selected element and is only well defined without ties.
    """
    return _reduce("median", t, axis, keepdims)


def sumsquare(t: Tensor, axis: int | Iterable[int] | None = None, keepdims: bool = False) -> Tensor:
    """Sum of squares ``Σ t²`` over ``axis`` (axis rules as ``sum``)."""
    return _reduce("sumsquare", t, axis, keepdims)


def l1(t: Tensor, axis: int | Iterable[int] | None = None, keepdims: bool = False) -> Tensor:
    """L1 norm ``Σ |t|`` over ``axis`` (axis rules as ``sum``)."""
    return _reduce("l1", t, axis, keepdims)


def l2(t: Tensor, axis: int | Iterable[int] | None = None, keepdims: bool = False) -> Tensor:
    """L2 norm ``sqrt(Σ t²)`` over ``axis`` (axis rules as ``sum``); integer results truncate."""
    return _reduce("l2", t, axis, keepdims)


def logsum(t: Tensor, axis: int | Iterable[int] | None = None, keepdims: bool = False) -> Tensor:
    """``log(Σ t)`` over ``axis`` (axis rules as ``sum``); NaN where the sum is negative."""
    return _reduce("logsum", t, axis, keepdims)


def logsumexp(t: Tensor, axis: int | Iterable[int] | None = None, keepdims: bool = False) -> Tensor:
    """``log(Σ exp(t))`` over ``axis`` (axis rules as ``sum``), computed without overflow."""
    return _reduce("logsumexp", t, axis, keepdims)


# argmax / argmin ---------------------------------------------------------------------------


def _arg_infer(t: Any, *, dim: int | None, keepdim: bool) -> list:
    axes = tuple(range(len(t.shape))) if dim is None else (dim,)
    return [spec(_reduced_shape(t.shape, axes, keepdim), dtypes.int32)]


def _arg_lowering(fn: Any) -> Any:
    def lower(x: Any, *, dim: int | None, keepdim: bool) -> Any:
        return fn(x, axis=dim, keepdims=keepdim).astype(jnp.int32)

    return lower


ARGMAX = define(
    "argmax", "ArgMax", _arg_infer, _arg_lowering(lambda *a, **k: jnp.argmax(*a, **k)), grad="none"
)
ARGMIN = define(
    "argmin", "ArgMin", _arg_infer, _arg_lowering(lambda *a, **k: jnp.argmin(*a, **k)), grad="none"
)


def _arg_reduce(opdef: OpDef, out: str, t: Tensor, dim: int | None, keepdim: bool | None) -> Tensor:
    attrs = {
        "dim": None if dim is None or not t.rank else normalize_axis(dim, t.rank, "dim"),
        "keepdim": bool(keepdim),
    }
    return record(opdef, {"t": t}, attrs, [out])[0]


def argmax(t: Tensor, dim: int | None = 0, keepdim: bool | None = False) -> Tensor:
    """Indices (int32) of the maximum values along ``dim``.

    Ties give the first index. ``dim`` may be negative; ``dim=None`` searches the flattened
    tensor (as ``torch.argmax``). With ``keepdim`` the reduced axis stays with size 1.
    No gradient. See also ``torch.argmax``.

    Raises:
        ValueError: ``dim`` is out of range for ``t``'s rank.
    """
    return _arg_reduce(ARGMAX, "argmax_out", t, dim, keepdim)


def argmin(t: Tensor, dim: int | None = 0, keepdim: bool | None = False) -> Tensor:
    """Indices (int32) of the minimum values along ``dim``; otherwise as ``argmax``."""
    return _arg_reduce(ARGMIN, "argmin_out", t, dim, keepdim)


# cumsum ----------------------------------------------------------------------------------


def _cumsum(x: Any, dim_tensor: Any, *, dim: int) -> Any:
    return jnp.cumsum(x, axis=dim, dtype=x.dtype)


CUMSUM = define("cumsum", "CumSum", lambda t, d, *, dim: [t], _cumsum, nondiff_inputs=(1,))


def cumsum(t: Tensor, dim: int | None = 0) -> Tensor:
    """Cumulative sum along ``dim`` (negative allowed); same shape and dtype as ``t``.

    Like PopXL, the op also takes a constant named ``dim`` holding the axis. It is int32 here
    (PopXL used int64, which would switch the whole program to 64-bit mode); the lowering
    reads the axis from the op's static attribute. See also ``numpy.cumsum``.

    Raises:
        ValueError: ``dim`` is out of range for ``t``'s rank.
    """
    axis = normalize_axis(0 if dim is None else dim, t.rank, "dim")
    dim_tensor = constant(axis, dtypes.int32, name="dim")
    return record(CUMSUM, {"t": t, "dim": dim_tensor}, {"dim": axis}, ["cumsum_out"])[0]


# topk ------------------------------------------------------------------------------------


def _topk_infer(t: Any, *, k: int, axis: int, largest: bool) -> list:
    shape = tuple(k if d == axis else n for d, n in enumerate(t.shape))
    return [spec(shape, t.dtype), spec(shape, dtypes.int32)]


def _topk(x: Any, *, k: int, axis: int, largest: bool) -> tuple:
    # A stable sort puts the lower index first among equal values, as ONNX TopK requires.
    order = jnp.argsort(x, axis=axis, stable=True, descending=largest).astype(jnp.int32)
    indices = lax.slice_in_dim(order, 0, k, axis=axis)
    return jnp.take_along_axis(x, indices, axis=axis), indices


TOPK = define("topk", "TopK", _topk_infer, _topk)


def topk(
    t: Tensor,
    k: int,
    axis: int,
    largest: bool,
    sorted: bool,  # noqa: A002 (public API name)
    available_memory_proportion: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The ``k`` largest (or smallest) values of ``t`` along ``axis``, and their indices.

    Returns ``(values, indices)``: ``t``'s shape with ``axis`` replaced by ``k``; values keep
    ``t``'s dtype, indices are int32. Values are always in sorted order (descending when
    ``largest``, else ascending) with the lower index first among equal values, which is one
    valid result when ``sorted`` is False. Values are differentiable, indices are not.

    Args:
        t: input tensor.
        k: number of elements to keep, in ``[1, t.shape[axis]]``.
        axis: axis to search (negative allowed).
        largest: keep the largest values (True) or the smallest (False).
        sorted: whether the caller needs sorted results; results are always sorted here.
        available_memory_proportion: an IPU tiling hint; no effect here.

    Raises:
        ValueError: ``axis`` out of range, or ``k`` outside ``[1, t.shape[axis]]``.
    """
    if not t.rank:
        raise ValueError("topk needs a tensor of rank >= 1, got a scalar. Reshape it to (1,).")
    axis = normalize_axis(axis, t.rank)
    size = t.shape[axis]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= size:
        raise ValueError(
            f"topk: k must be an int in [1, {size}] (the size of axis {axis} of a tensor of "
            f"shape {t.shape}), got {k!r}."
        )
    attrs = {"k": int(k), "axis": axis, "largest": bool(largest)}
    values, indices = record(TOPK, {"t": t}, attrs, ["topk_out_value", "topk_out_indices"])
    return values, indices


# lamb_square -----------------------------------------------------------------------------


def _lamb_square(x: Any) -> Any:
    x = x.astype(jnp.float32)
    return jnp.sum(x * x)


LAMB_SQUARE = define(
    "lamb_square", "LambSquare", lambda t: [spec((), dtypes.float32)], _lamb_square
)


def lamb_square(t: Tensor) -> Tensor:
    """Sum of squares of all elements of ``t``, as a float32 scalar (shape ``()``).

    Inputs of any float dtype are accumulated in float32. LAMB uses it for the squared norms
    passed to ``var_updates.adam_var_update``.
    """
    return record(LAMB_SQUARE, {"t": t}, None, ["lamb_square_out"])[0]


# histogram -------------------------------------------------------------------------------


def _histogram_infer(t: Any, *, levels: tuple[float, ...], absolute_of_input: bool) -> list:
    return [spec((len(levels) + 1,), dtypes.uint32)]


def _histogram(x: Any, *, levels: tuple[float, ...], absolute_of_input: bool) -> Any:
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32)).ravel()
    if absolute_of_input:
        x = jnp.abs(x)
    bins = jnp.searchsorted(jnp.asarray(levels, x.dtype), x, side="right")
    return jnp.zeros(len(levels) + 1, jnp.uint32).at[bins].add(jnp.uint32(1))


HISTOGRAM = define("histogram", "Histogram", _histogram_infer, _histogram, grad="none")


def histogram(t: Tensor, levels: list[float], absolute_of_input: bool) -> Tensor:
    """Count the elements of ``t`` per bin; uint32 counts of shape ``(len(levels) + 1,)``.

    The levels are sorted first (as PopART did). With sorted levels ``l_0 <= ... <=
    l_{n-1}`` the bins are: ``x < l_0``; ``l_i <= x < l_{i+1}``; ``x >= l_{n-1}``. So each
    bin includes its lower level, a value equal to the last level lands in the last bin,
    and the bin between two equal levels stays empty. With ``absolute_of_input`` the counts
    are of ``|t|``. Values are compared in float32 (at least). No gradient.
    """
    values = tuple(sorted(float(v) for v in levels))
    attrs = {"levels": values, "absolute_of_input": bool(absolute_of_input)}
    return record(HISTOGRAM, {"t": t}, attrs, ["histogram_out"])[0]
