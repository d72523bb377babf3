"""``Tensor.__getitem__``: basic slicing, integer-tensor gathers and boolean masks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import dtypes

if TYPE_CHECKING:
    from .tensor import Tensor

BAD_KEY_MSG = (
    "Only integers, slices (:), integer tensors and boolean tensors are valid indices. Got "
    "{key!r} of type {type}."
)


def _is_basic(key: Any) -> bool:
    items = key if isinstance(key, tuple) else (key,)
    return all(
        isinstance(k, slice) or (isinstance(k, (int, np.integer)) and not isinstance(k, bool))
        for k in items
    )


def _axis_bounds(k: Any, dim: int) -> tuple[tuple[int, int, int], int, bool]:
    """(slice bounds with step ±1, subsample stride, squeeze this axis) for one key item."""
    if isinstance(k, slice):
        indices = range(*k.indices(dim))
        step = indices.step
        if not indices:
            return (0, 0, 1), 1, False
        last = indices[-1]
        if step > 0:
            return (indices.start, last + 1, 1), step, False
        return (indices.start, last - 1, -1), -step, False
    index = int(k)
    if not -dim <= index < dim:
        raise IndexError(f"index {index} is out of bounds for an axis of size {dim}.")
    index %= dim
    return (index, index + 1, 1), 1, True


def _basic(t: Tensor, key: Any) -> Tensor:
    from .ops import shape as shape_ops  # noqa: PLC0415

    items = key if isinstance(key, tuple) else (key,)
    if len(items) > t.rank:
        raise IndexError(f"too many indices ({len(items)}) for a tensor of rank {t.rank}.")
    bounds, strides, squeeze = [], [], []
    for axis, dim in enumerate(t.shape):
        if axis < len(items):
            b, s, q = _axis_bounds(items[axis], dim)
        else:
            b, s, q = (0, dim, 1), 1, False
        bounds.append(b)
        strides.append(s)
        if q:
            squeeze.append(axis)
    out = t
    if any(b != (0, d, 1) for b, d in zip(bounds, t.shape)):
        out = shape_ops.record(shape_ops.SLICE, {"t": t}, {"bounds": tuple(bounds)}, ["slice_out"])[
            0
        ]
    if any(s > 1 for s in strides):
        out = shape_ops.subsample(out, strides)
    if squeeze:
        out = shape_ops.reshape(out, [d for i, d in enumerate(out.shape) if i not in squeeze])
    return out


def getitem(t: Tensor, key: Any) -> Tensor:
    from . import ops  # noqa: PLC0415
    from .tensor import Tensor, constant  # noqa: PLC0415

    if isinstance(key, (bool, str, float)) or key is None:
        raise TypeError(BAD_KEY_MSG.format(key=key, type=type(key).__name__))
    if _is_basic(key):
        return _basic(t, key)
    if not isinstance(key, Tensor):
        try:
            key = constant(key)
        except Exception:
            raise TypeError(BAD_KEY_MSG.format(key=key, type=type(key).__name__)) from None
    if key.dtype is dtypes.bool:
        return ops.where(key, t, t._ensure_tensor(0))
    if key.dtype.is_int:
        return ops.gather(t, key)
    raise TypeError(BAD_KEY_MSG.format(key=key, type=type(key).__name__))
