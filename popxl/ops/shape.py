"""Shape and view ops: reshape, transpose, slice, subsample, concat, split, cast.

The ``_`` variants return views that share their input's storage: writing through the view
(e.g. ``var_updates.accumulate_(ops.slice_(w, ...), x)``) updates the base tensor.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .. import dtypes
from .._op import core_error, define, define_view
from ..tensor import Tensor
from ._base import jnp, normalize_axis, record, spec

INT_MAX = 2**31 - 1
INT_MIN = -(2**31)

# reshape ------------------------------------------------------------------------------


def _reshape_infer(t: Any, *, shape: tuple[int, ...]) -> list:
    return [spec(shape, t.dtype)]


def _reshape_inverse(old: Sequence[Any], new: Any, *, shape: tuple[int, ...]) -> tuple:
    return (new.reshape(old[0].shape),)


RESHAPE = define(
    "reshape", "Reshape", _reshape_infer, lambda x, *, shape: x.reshape(shape), grad_needs="none"
)
RESHAPE_ = define_view(RESHAPE, "reshape_", "ReshapeInplace", _reshape_inverse)


def _resolved_shape(t: Tensor, shape: Iterable[int]) -> tuple[int, ...]:
    dims = [int(d) for d in shape]
    if dims.count(-1) > 1:
        raise ValueError(f"Only one dimension of the new shape can be -1, got {tuple(dims)}.")
    if any(d == 0 or d < -1 for d in dims):
        raise ValueError(
            f"Invalid shape {tuple(dims)}: dimensions must be positive, or -1 for one inferred "
            "dimension."
        )
    known = math.prod(d for d in dims if d != -1)
    if -1 in dims:
        if known == 0 or t.nelms % known:
            raise ValueError(f"Cannot reshape {t.shape} ({t.nelms} elements) to {tuple(dims)}.")
        dims[dims.index(-1)] = t.nelms // known
    if math.prod(dims) != t.nelms:
        raise ValueError(f"Cannot reshape {t.shape} ({t.nelms} elements) to {tuple(dims)}.")
    return tuple(dims)


def reshape(t: Tensor, shape: Iterable[int]) -> Tensor:
    """``t`` with a new shape of the same size; one dimension may be -1 (inferred).

    Raises:
        ValueError: more than one -1, a zero or negative dimension, or a size mismatch.
    """
    attrs = {"shape": _resolved_shape(t, shape)}
    return record(RESHAPE, {"t": t}, attrs, [f"{t.name}_reshaped"])[0]


def reshape_(t: Tensor, shape: Iterable[int]) -> Tensor:
    """``reshape`` returning a view of ``t``'s storage."""
    attrs = {"shape": _resolved_shape(t, shape)}
    return record(RESHAPE_, {"t": t}, attrs, [f"{t.name}_reshaped"])[0]


def flatten(t: Tensor) -> Tensor:
    """``reshape(t, (-1,))``."""
    return reshape(t, (-1,))


def flatten_(t: Tensor) -> Tensor:
    """``reshape_(t, (-1,))``."""
    return reshape_(t, (-1,))


def squeeze(t: Tensor, axes: Iterable[int] | None = None) -> Tensor:
    """Remove size-1 axes (all of them when ``axes`` is None), as a reshape.

    Raises:
        ValueError: a repeated axis, an axis out of range or an axis whose size is not 1.
    """
    if axes is None:
        keep = [d for d in t.shape if d != 1]
    else:
        axes = [int(a) for a in ([axes] if isinstance(axes, int) else axes)]
        normal = [normalize_axis(a, t.rank) for a in axes]
        if len(set(normal)) != len(normal):
            raise ValueError(f"Duplicate axes in squeeze: {axes}.")
        for a in normal:
            if t.shape[a] != 1:
                raise ValueError(f"Cannot squeeze axis {a} of shape {t.shape}: its size is not 1.")
        keep = [d for i, d in enumerate(t.shape) if i not in normal]
    return reshape(t, keep)


# transpose -------------------------------------------------------------------------------


def _transpose_infer(t: Any, *, permutation: tuple[int, ...]) -> list:
    return [spec(tuple(t.shape[p] for p in permutation), t.dtype)]


def _transpose_inverse(old: Sequence[Any], new: Any, *, permutation: tuple[int, ...]) -> tuple:
    return (jnp.transpose(new, np.argsort(permutation)),)


TRANSPOSE = define(
    "transpose",
    "Transpose",
    _transpose_infer,
    lambda x, *, permutation: jnp.transpose(x, permutation),
    grad_needs="none",
)
TRANSPOSE_ = define_view(TRANSPOSE, "transpose_", "TransposeInplace", _transpose_inverse)


def _permutation(t: Tensor, permutation: Iterable[int] | None) -> tuple[int, ...]:
    perm = () if permutation is None else tuple(int(p) for p in permutation)
    if not perm:  # PopART's Transpose reversed the axes for an empty permutation too
        return tuple(reversed(range(t.rank)))
    normal = tuple(p + t.rank if -t.rank <= p < 0 else p for p in perm)
    if sorted(normal) != list(range(t.rank)):
        raise ValueError(
            f"Invalid permutation {perm} for a tensor of rank {t.rank}: it must name each of "
            f"the axes 0..{t.rank - 1} exactly once (negative entries count from the end)."
        )
    return normal


def transpose(t: Tensor, permutation: Iterable[int] | None = None) -> Tensor:
    """Permute the axes of ``t`` (reverse them when ``permutation`` is None or empty).

    Negative entries count from the end, as in ``numpy.transpose``.

    Raises:
        ValueError: ``permutation`` does not name every axis exactly once.
    """
    attrs = {"permutation": _permutation(t, permutation)}
    return record(TRANSPOSE, {"t": t}, attrs, [f"{t.name}_T"])[0]


def transpose_(t: Tensor, permutation: Iterable[int] | None = None) -> Tensor:
    """``transpose`` returning a view of ``t``'s storage."""
    attrs = {"permutation": _permutation(t, permutation)}
    return record(TRANSPOSE_, {"t": t}, attrs, [f"{t.name}_T"])[0]


# slice ----------------------------------------------------------------------------------

_Bounds = tuple[tuple[int, int, int], ...]  # per axis: normalised (start, stop, step)


def _slice_infer(t: Any, *, bounds: _Bounds) -> list:
    shape = tuple(len(range(*b)) for b in bounds)
    return [spec(shape, t.dtype)]


def _slice_index(bounds: _Bounds) -> tuple[builtins.slice, ...]:
    return tuple(
        builtins.slice(start, None if stop < 0 else stop, step)
        if len(range(start, stop, step))
        else builtins.slice(0, 0)
        for start, stop, step in bounds
    )


def _slice(x: Any, *, bounds: _Bounds) -> Any:
    return x[_slice_index(bounds)]


def _slice_inverse(old: Sequence[Any], new: Any, *, bounds: _Bounds) -> tuple:
    return (old[0].at[_slice_index(bounds)].set(new),)


SLICE = define("slice", "Slice", _slice_infer, _slice, grad_needs="none")
SLICE_ = define_view(SLICE, "slice_", "SliceInplace", _slice_inverse)


def _as_list(value: Any) -> list[int | None] | None:
    """One entry per sliced axis; None entries take their default (as in PopXL)."""
    if value is None:
        return None
    if isinstance(value, (int, np.integer)):
        return [int(value)]
    return [None if v is None else int(v) for v in value]


def _entry(values: list[int | None] | None, k: int, default: int) -> int:
    value = values[k] if values is not None else None
    return default if value is None else value


def _onnx_bounds(dim: int, start: int, stop: int, step: int) -> tuple[int, int, int]:
    """ONNX Slice: negative indices count from the end, then clamp."""
    if step == 0:
        raise ValueError("slice step cannot be 0.")
    start = start + dim if start < 0 else start
    stop = stop + dim if stop < 0 else stop
    if step > 0:
        return min(max(start, 0), dim), min(max(stop, 0), dim), step
    return min(max(start, -1), dim - 1), min(max(stop, -1), dim - 1), step


def _slice_bounds(t: Tensor, start: Any, stop: Any, step: Any, axis: Any) -> _Bounds:
    starts, stops, steps, axes = (_as_list(v) for v in (start, stop, step, axis))
    lengths = {len(v) for v in (starts, stops, steps, axes) if v is not None}
    if len(lengths) > 1:
        raise ValueError(
            "All inputs must have same length: start, stop, step and axis must each have one "
            f"entry per sliced axis. Got start={start}, stop={stop}, step={step}, axis={axis}."
        )
    n = lengths.pop() if lengths else t.rank
    axes = axes if axes is not None else list(range(n))
    bounds = [(0, d, 1) for d in t.shape]
    for k, ax in enumerate(axes):
        if ax is None:
            raise ValueError(f"slice: axis entries cannot be None, got axis={axis}.")
        ax = normalize_axis(ax, t.rank)
        st = _entry(steps, k, 1)
        default_start, default_stop = (0, INT_MAX) if st > 0 else (-1, INT_MIN)
        s0 = _entry(starts, k, default_start)
        s1 = _entry(stops, k, default_stop)
        bounds[ax] = _onnx_bounds(t.shape[ax], s0, s1, st)
    return tuple(bounds)


def slice(  # noqa: A001 (public API name)
    t: Tensor,
    start: int | Sequence[int] | None = None,
    stop: int | Sequence[int] | None = None,
    step: int | Sequence[int] | None = None,
    axis: int | Sequence[int] | None = None,
) -> Tensor:
    """Slice ``t`` along ``axis`` (ONNX Slice semantics: negative indices wrap, bounds clamp).

    ``start``/``stop``/``step``/``axis`` take one value or one per sliced axis; a None entry
    in ``start``/``stop``/``step`` takes its default (the whole axis, step 1), as
    ``x[:, 1:]`` is ``slice(x, start=[None, 1], axis=[0, 1])``. With none of ``start``,
    ``stop`` and ``step`` given, ``t`` itself is returned.
    """
    if start is None and stop is None and step is None:
        return t
    attrs = {"bounds": _slice_bounds(t, start, stop, step, axis)}
    return record(SLICE, {"t": t}, attrs, ["slice_out"])[0]


def slice_(
    t: Tensor,
    start: int | Sequence[int] | None = None,
    stop: int | Sequence[int] | None = None,
    step: int | Sequence[int] | None = None,
    axis: int | Sequence[int] | None = None,
) -> Tensor:
    """``slice`` returning a view of ``t``'s storage."""
    if start is None and stop is None and step is None:
        return t
    attrs = {"bounds": _slice_bounds(t, start, stop, step, axis)}
    return record(SLICE_, {"t": t}, attrs, ["slice_out"])[0]


def _subsample_infer(t: Any, *, strides: tuple[int, ...]) -> list:
    shape = tuple(-(-d // s) for d, s in zip(t.shape, strides))
    return [spec(shape, t.dtype)]


SUBSAMPLE = define(
    "subsample",
    "Subsample",
    _subsample_infer,
    lambda x, *, strides: x[tuple(np.s_[::s] for s in strides)],
    grad_needs="none",
)


def subsample(t: Tensor, strides: int | Iterable[int]) -> Tensor:
    """Every ``strides[i]``-th element along each axis (strides padded with 1s).

    Raises:
        ValueError: more strides than axes, or a stride < 1.
    """
    values = [int(strides)] if isinstance(strides, (int, np.integer)) else [int(s) for s in strides]
    if len(values) > t.rank:
        raise ValueError(f"subsample got {len(values)} strides for a tensor of rank {t.rank}.")
    if any(s < 1 for s in values):
        raise ValueError(f"subsample strides must be >= 1, got {values}.")
    values += [1] * (t.rank - len(values))
    return record(SUBSAMPLE, {"t": t}, {"strides": tuple(values)}, ["subsample_out"])[0]


# concat / split -------------------------------------------------------------------------


def _concat_infer(*specs: Any, axis: int) -> list:
    first = specs[0]
    for s in specs[1:]:
        if len(s.shape) != len(first.shape) or any(
            a != b for i, (a, b) in enumerate(zip(s.shape, first.shape)) if i != axis
        ):
            raise core_error(
                f"concat: shapes {[x.shape for x in specs]} differ outside axis {axis}."
            )
    size = sum(s.shape[axis] for s in specs)
    shape = first.shape[:axis] + (size,) + first.shape[axis + 1 :]
    return [spec(shape, first.dtype)]


def _concat_inverse(old: Sequence[Any], new: Any, *, axis: int) -> tuple:
    edges = np.cumsum([o.shape[axis] for o in old])[:-1]
    return tuple(jnp.split(new, edges, axis=axis))


CONCAT = define(
    "concat",
    "Concat",
    _concat_infer,
    lambda *xs, axis: jnp.concatenate(xs, axis),
    grad_needs="none",
)
CONCAT_ = define_view(CONCAT, "concat_", "ConcatInplace", _concat_inverse)


def _concat_inputs(ts: Iterable[Tensor], axis: int) -> tuple[dict, dict]:
    tensors = list(ts)
    if not tensors:
        raise ValueError("concat needs at least one tensor.")
    types = [t.dtype for t in tensors]
    if len(set(types)) > 1:
        raise TypeError(
            f"All inputs to a concat operation must have the same type: {types}. Cast them to "
            "one dtype first (ops.cast; float8 data via ops.pow2scale_cast_from_fp8)."
        )
    if tensors[0].rank == 0:
        raise ValueError(
            f"concat: axis {axis} is out of range for scalar (rank 0) tensors; reshape them "
            "to shape (1,) to join them."
        )
    ax = normalize_axis(axis, tensors[0].rank)
    return {f"t{i}": t for i, t in enumerate(tensors)}, {"axis": ax}


def concat(ts: Iterable[Tensor], axis: int = 0) -> Tensor:
    """Join tensors of equal dtype along ``axis``."""
    inputs, attrs = _concat_inputs(ts, axis)
    return record(CONCAT, inputs, attrs, ["concat_out"])[0]


def concat_(ts: Iterable[Tensor], axis: int = 0) -> Tensor:
    """``concat`` whose output is a view of its inputs' storage."""
    inputs, attrs = _concat_inputs(ts, axis)
    return record(CONCAT_, inputs, attrs, ["concat_out"])[0]


def split(t: Tensor, splits: int | list[int], axis: int = 0) -> list[Tensor]:
    """Split ``t`` along ``axis`` into ``splits`` equal parts or parts of the given lengths.

    Raises:
        ValueError: an int that does not divide the axis.
        PopXLException: lengths that do not sum to the axis size.
    """
    ax = normalize_axis(axis, t.rank)
    size = t.shape[ax]
    if isinstance(splits, int):
        if splits < 1 or size % splits:
            raise ValueError(
                f"split: axis {ax} of size {size} cannot be split into {splits} equal parts."
            )
        lengths = [size // splits] * splits
    else:
        lengths = [int(s) for s in splits]
        if sum(lengths) != size:
            raise core_error(f"split lengths {lengths} do not sum to the axis size {size}.")
    outs = []
    begin = 0
    for i, n in enumerate(lengths):
        bounds = tuple(
            (begin, begin + n, 1) if a == ax else (0, d, 1) for a, d in enumerate(t.shape)
        )
        outs.append(record(SLICE, {"t": t}, {"bounds": bounds}, [f"{t.name}_split_{i}"])[0])
        begin += n
    return outs


# cast -----------------------------------------------------------------------------------


def _cast_infer(t: Any, *, data_type: dtypes.dtype) -> list:
    return [spec(t.shape, data_type, t.meta_shape)]


def _cast(x: Any, *, data_type: dtypes.dtype) -> Any:
    target = data_type.as_numpy()
    if target == np.bool_:
        return x != 0
    return x.astype(target)


CAST = define("cast", "Cast", _cast_infer, _cast, grad_needs="none")


def cast(t: Tensor, data_type: dtypes.dtype) -> Tensor:
    """``t`` converted to ``data_type`` (float to int truncates toward zero).

    Raises:
        TypeError: a float8 target; use ``pow2scale_cast_to_fp8``.
    """
    if data_type in (dtypes.float8_143, dtypes.float8_152):
        raise TypeError(
            f"ops.cast cannot cast to {data_type}; use ops.pow2scale_cast_to_fp8 instead."
        )
    return record(CAST, {"t": t}, {"data_type": data_type}, [f"{t.name}_{data_type.name}"])[0]
