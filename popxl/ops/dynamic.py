"""Slices at runtime offsets: ``dynamic_slice``, ``dynamic_update`` and ``dynamic_update_``.

The offsets are a tensor (``index``, one entry per sliced axis), the slice sizes are fixed
when the op is built. Offsets that would put the slice past the end of an axis are clamped
so the slice stays inside ``t`` (the original left them unsupported); this is
``lax.dynamic_slice`` behaviour.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from .. import context
from .._op import core_error, define, define_inplace
from ..tensor import Tensor
from ._base import check_in_graph, jnp, lax, normalize_axis, record, spec
from .gather import NOT_INT_MSG, _as_int32


def _sliced_shape(shape: tuple[int, ...], axes: tuple[int, ...], sizes: tuple[int, ...]) -> tuple:
    out = list(shape)
    for a, s in zip(axes, sizes):
        out[a] = s
    return tuple(out)


def _check_index(op: str, index: Any, axes: tuple[int, ...]) -> None:
    if not index.dtype.is_int:
        raise TypeError(NOT_INT_MSG.format(op=op, name="index", dtype=index.dtype.name))
    if len(index.shape) > 1 or math.prod(index.shape) != len(axes):
        raise core_error(
            f"{op}: `index` must be a vector with one offset per axis in axes={list(axes)}, "
            f"got shape {index.shape}."
        )


def _starts(index: Any, rank: int, axes: tuple[int, ...]) -> list:
    offsets = _as_int32(index).reshape(-1)
    starts = [jnp.zeros((), jnp.int32)] * rank
    for k, a in enumerate(axes):
        starts[a] = offsets[k]
    return starts


# Inference and lowering -----------------------------------------------------------------


def _slice_infer(t: Any, index: Any, *, axes: tuple, sizes: tuple, no_overlap: bool) -> list:
    _check_index("dynamic_slice", index, axes)
    return [spec(_sliced_shape(t.shape, axes, sizes), t.dtype)]


def _lower_dynamic_slice(x: Any, index: Any, *, axes: tuple, sizes: tuple, no_overlap: bool) -> Any:
    shape = _sliced_shape(x.shape, axes, sizes)
    return lax.dynamic_slice(x, _starts(index, x.ndim, axes), shape)


def _update_infer(
    t: Any, index: Any, update: Any, *, axes: tuple, sizes: tuple, no_overlap: bool
) -> list:
    _check_index("dynamic_update", index, axes)
    expected = _sliced_shape(t.shape, axes, sizes)
    if update.shape != expected:
        raise core_error(
            f"dynamic_update: `t_update` has shape {update.shape}, but slicing `t` {t.shape} "
            f"with axes={list(axes)} and sizes={list(sizes)} gives {expected}."
        )
    if update.dtype is not t.dtype:
        raise core_error(
            f"dynamic_update: `t_update` has dtype {update.dtype.name} but `t` has "
            f"{t.dtype.name}; cast one of them."
        )
    return [t]


def _lower_dynamic_update(
    x: Any, index: Any, update: Any, *, axes: tuple, sizes: tuple, no_overlap: bool
) -> Any:
    return lax.dynamic_update_slice(x, update, _starts(index, x.ndim, axes))


DYNAMIC_SLICE = define(
    "dynamic_slice", "DynamicSlice", _slice_infer, _lower_dynamic_slice, nondiff_inputs=(1,)
)
DYNAMIC_UPDATE = define(
    "dynamic_update", "DynamicUpdate", _update_infer, _lower_dynamic_update, nondiff_inputs=(1,)
)
DYNAMIC_UPDATE_ = define_inplace(DYNAMIC_UPDATE, "dynamic_update_", "DynamicUpdateInplace")


# Public functions -----------------------------------------------------------------------


def _slice_attrs(
    op: str, t: Tensor, axes: Iterable[int], sizes: Iterable[int], no_overlap: bool
) -> dict:
    axes_t = tuple(normalize_axis(int(a), t.rank, f"{op}: axis") for a in axes)
    sizes_t = tuple(int(s) for s in sizes)
    if len(axes_t) != len(sizes_t):
        raise ValueError(
            f"{op}: axes {list(axes_t)} and sizes {list(sizes_t)} must have the same length "
            "(one slice size per axis)."
        )
    if len(set(axes_t)) != len(axes_t):
        raise ValueError(f"{op}: axes {list(axes_t)} name an axis twice.")
    for a, s in zip(axes_t, sizes_t):
        if not 0 <= s <= t.shape[a]:
            raise ValueError(
                f"{op}: size {s} for axis {a} must be between 0 and the axis length "
                f"{t.shape[a]} of `t` {t.shape}."
            )
    return {"axes": axes_t, "sizes": sizes_t, "no_overlap": bool(no_overlap)}


def dynamic_slice(
    t: Tensor, index: Tensor, axes: list[int], sizes: list[int], no_overlap: bool
) -> Tensor:
    """A copy of the block of ``t`` starting at the runtime offsets ``index``.

    Along ``axes[k]`` the slice is ``[index[k], index[k] + sizes[k])``; other axes are kept
    whole, so the output is ``t.shape`` with ``sizes`` on ``axes``. An offset past
    ``t.shape[axes[k]] - sizes[k]`` is clamped so the slice stays inside ``t`` (step 1 and
    no negative offsets, as in the original).

    >>> # t (4, 6), index [1, 2], axes [0, 1], sizes [2, 3] -> t[1:3, 2:5]

    Args:
        t: the tensor to slice.
        index: integer vector (int32/uint32...) of ``len(axes)`` offsets.
        axes: the sliced axes (negative counts from the end; no repeats).
        sizes: the slice length for each of ``axes``.
        no_overlap: accepted for compatibility. In PopART it let the gradient assume
            that no two slices overlap; gradients here are always exact.

    Raises:
        ValueError: ``axes`` and ``sizes`` differ in length, repeated axes, a size larger
            than its axis.
        TypeError: ``index`` is not an integer tensor.
        PopXLException: ``index`` does not hold one offset per axis.

    See also: ``jax.lax.dynamic_slice``.
    """
    check_in_graph(context.get_current_graph(), t=t, index=index)
    attrs = _slice_attrs("dynamic_slice", t, axes, sizes, no_overlap)
    return record(DYNAMIC_SLICE, {"t": t, "index": index}, attrs, ["dynamic_slice_out"])[0]


def _update(
    opdef: Any,
    name: str,
    t: Tensor,
    index: Tensor,
    t_update: Tensor,
    axes: Any,
    sizes: Any,
    no_overlap: bool,
) -> Tensor:
    inputs = {"t": t, "index": index, "t_update": t_update}
    check_in_graph(context.get_current_graph(), **inputs)
    attrs = _slice_attrs("dynamic_update", t, axes, sizes, no_overlap)
    return record(opdef, inputs, attrs, [name])[0]


def dynamic_update(
    t: Tensor,
    index: Tensor,
    t_update: Tensor,
    axes: Iterable[int],
    sizes: Iterable[int],
    no_overlap: bool,
) -> Tensor:
    """A copy of ``t`` with the block at runtime offsets ``index`` replaced by ``t_update``.

    The block is the one ``dynamic_slice(t, index, axes, sizes)`` reads; ``t_update`` must
    have exactly its shape and ``t``'s dtype. Offsets are clamped the same way.

    Raises:
        ValueError: as ``dynamic_slice``.
        PopXLException: ``t_update``'s shape or dtype does not match the block.

    See also: ``jax.lax.dynamic_update_slice``.
    """
    return _update(
        DYNAMIC_UPDATE, "dynamic_update_out", t, index, t_update, axes, sizes, no_overlap
    )


def dynamic_update_(
    t: Tensor,
    index: Tensor,
    t_update: Tensor,
    axes: Iterable[int],
    sizes: Iterable[int],
    no_overlap: bool,
) -> Tensor:
    """In-place ``dynamic_update``: writes into ``t`` and returns a handle on its storage."""
    return _update(
        DYNAMIC_UPDATE_,
        "dynamicupdateinplace_out",
        t,
        index,
        t_update,
        axes,
        sizes,
        no_overlap,
    )
