"""Index-driven data movement: gather, scatter, scatter-reduce and one-hot.

Index inputs (``indices``, the one-hot ``t``) must have an integer dtype and never receive
a gradient. Where the original left out-of-range indices undefined, this module picks one
deterministic behaviour and documents it on each op: ``gather`` clamps into range (or
gives zeros with ``zero_OOR=True``), the scatters ignore updates whose index is out of
range.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import numpy as np

from .. import context
from .._op import core_error, define
from ..tensor import Constant, Tensor
from ._base import check_in_graph, jax, jnp, normalize_axis, record, spec

INT32_MAX = 2**31 - 1
SCATTER_REDUCTIONS = ("sum", "min", "max", "none")

NOT_INT_MSG = (
    "{op}: `{name}` must have an integer dtype (int32, uint32...), got {dtype}. Cast it "
    "with ops.cast(x, popxl.int32) first."
)
NUM_CLASSES_MSG = (
    "onehot: `num_classes` decides the output shape, so its value must be known when the "
    "op is created: pass a popxl.constant holding one positive integer (got {what})."
)


def _check_int(op: str, name: str, s: Any) -> None:
    if not s.dtype.is_int:
        raise TypeError(NOT_INT_MSG.format(op=op, name=name, dtype=s.dtype.name))


def _as_int32(idx: Any) -> Any:
    """Indices as int32; unsigned values too large for int32 stay out of range."""
    if jnp.issubdtype(idx.dtype, jnp.unsignedinteger):
        idx = jnp.minimum(idx, jnp.asarray(INT32_MAX, idx.dtype))
    return idx.astype(jnp.int32)


def _element_positions(idx: Any, axis: int) -> tuple:
    """Index tuple addressing ``out[i0, .., idx[i], .., in]`` for every position i of idx."""
    grids = jnp.indices(idx.shape, sparse=True)
    return tuple(idx if d == axis else g for d, g in enumerate(grids))


# gather ---------------------------------------------------------------------------------


def _gather_infer(t: Any, indices: Any, *, axis: int, zero_OOR: bool) -> list:  # noqa: N803
    _check_int("gather", "indices", indices)
    return [spec(t.shape[:axis] + indices.shape + t.shape[axis + 1 :], t.dtype)]


def _take(x: Any, idx: Any, *, axis: int, zero_OOR: bool) -> Any:  # noqa: N803
    n = x.shape[axis]
    idx = _as_int32(idx)
    out = jnp.take(x, jnp.clip(idx, 0, max(n - 1, 0)), axis=axis)
    if not zero_OOR:
        return out
    valid = (idx >= 0) & (idx < n)
    valid = valid.reshape((1,) * axis + idx.shape + (1,) * (x.ndim - axis - 1))
    return jnp.where(valid, out, jnp.zeros((), out.dtype))


GATHER = define("gather", "Gather", _gather_infer, _take, nondiff_inputs=(1,))
TIED_GATHER = define("tied_gather", "TiedGather", _gather_infer, _take, nondiff_inputs=(1,))


def _gather_inputs(t: Tensor, indices: Tensor, axis: int, zero_OOR: bool) -> dict:  # noqa: N803
    check_in_graph(context.get_current_graph(), t=t, indices=indices)
    if t.rank == 0:
        raise ValueError("gather needs an input `t` of rank >= 1; got a scalar.")
    return {"axis": normalize_axis(axis, t.rank), "zero_OOR": bool(zero_OOR)}


def gather(
    t: Tensor,
    indices: Tensor,
    axis: int = 0,
    available_memory_proportion: float | None = None,
    zero_OOR: bool = False,  # noqa: N803 (public API name)
) -> Tensor:
    """Select slices of ``t`` along ``axis`` by integer ``indices`` (``numpy.take``).

    The output has shape ``t.shape[:axis] + indices.shape + t.shape[axis+1:]`` and ``t``'s
    dtype. This is ONNX Gather, not ``torch.gather``.

    >>> # x = [[0, 1], [2, 3], [4, 5]];  gather(x, [[2, 0]]) -> [[[4, 5], [0, 1]]]

    Args:
        t: the tensor to read from.
        indices: integer tensor of positions along ``axis``.
        axis: the axis to gather along (negative counts from the end).
        available_memory_proportion: an IPU memory-planning hint; no effect here.
        zero_OOR: if True, out-of-range indices (negative ones included) give zeros. If
            False the original's result is undefined; here indices are clamped into
            ``[0, t.shape[axis] - 1]`` (negative indices do not wrap around).

    Raises:
        TypeError: ``indices`` is not an integer tensor.
        ValueError: ``axis`` is out of range.

    See also: ``numpy.take``, ``jax.numpy.take``.
    """
    attrs = _gather_inputs(t, indices, axis, zero_OOR)
    return record(GATHER, {"t": t, "indices": indices}, attrs, ["gather_out"])[0]


def tied_gather(
    t: Tensor,
    indices: Tensor,
    axis: int = 0,
    available_memory_proportion: float | None = None,
    zero_OOR: bool = False,  # noqa: N803 (public API name)
) -> Tensor:
    """``gather`` under its own op type (``TiedGather``); numerically identical.

    On the IPU it left the tile layout of ``indices`` to a following matmul (a weight tied
    to an embedding); that layout choice has no counterpart here.
    """
    attrs = _gather_inputs(t, indices, axis, zero_OOR)
    return record(TIED_GATHER, {"t": t, "indices": indices}, attrs, ["tiedgather_out"])[0]


def _grouped_infer(
    t: Any,
    indices: Any,
    *,
    axis: int,
    group_size: int,
    zero_OOR: bool,  # noqa: N803
) -> list:
    if group_size == 1:
        return _gather_infer(t, indices, axis=axis, zero_OOR=zero_OOR)
    _check_int("groupedgather", "indices", indices)
    if not indices.shape or t.shape[0] != group_size or indices.shape[0] != group_size:
        raise core_error(
            f"groupedgather: with group_size={group_size}, dimension 0 of both `t` (shape "
            f"{t.shape}) and `indices` (shape {indices.shape}) must be the group dimension "
            f"of size {group_size}."
        )
    return [spec(t.shape[:axis] + indices.shape[1:] + t.shape[axis + 1 :], t.dtype)]


def _grouped_take(
    x: Any,
    idx: Any,
    *,
    axis: int,
    group_size: int,
    zero_OOR: bool,  # noqa: N803
) -> Any:
    if group_size == 1:
        return _take(x, idx, axis=axis, zero_OOR=zero_OOR)
    return jax.vmap(partial(_take, axis=axis - 1, zero_OOR=zero_OOR))(x, idx)


GROUPED_GATHER = define(
    "groupedgather", "GroupedGather", _grouped_infer, _grouped_take, nondiff_inputs=(1,)
)


def groupedgather(
    t: Tensor,
    indices: Tensor,
    axis: int = 0,
    group_size: int | None = 1,
    available_memory_proportion: float | None = None,
    zero_OOR: bool = False,  # noqa: N803 (public API name)
) -> Tensor:
    """``gather`` applied independently to each of ``group_size`` groups.

    With ``group_size > 1``, dimension 0 of both ``t`` and ``indices`` is the group
    dimension (size ``group_size``) and ``axis`` (>= 1) is an axis of ``t``: group ``g``
    gathers ``t[g]`` along ``axis - 1`` with ``indices[g]``. The output shape is
    ``t.shape[:axis] + indices.shape[1:] + t.shape[axis+1:]`` (the group dimension stays
    first). With ``group_size`` 1 (or None) this is plain ``gather``. Out-of-range indices
    behave as in ``gather``.

    >>> # t (2, 3, 4), indices (2, 5), axis=1, group_size=2 -> output (2, 5, 4)

    Raises:
        ValueError: ``group_size < 1``, or ``axis`` 0 with ``group_size > 1``.
        PopXLException: the group dimensions of ``t`` and ``indices`` are not ``group_size``.

    See also: ``jax.vmap`` of ``jnp.take``; TensorFlow ``gather(..., batch_dims=1)``.
    """
    group_size = 1 if group_size is None else int(group_size)
    if group_size < 1:
        raise ValueError(f"groupedgather: group_size must be >= 1, got {group_size}.")
    attrs = _gather_inputs(t, indices, axis, zero_OOR)
    if group_size > 1 and attrs["axis"] == 0:
        raise ValueError(
            "groupedgather: axis 0 is the group dimension when group_size > 1; gather along "
            "an axis >= 1 of `t`."
        )
    attrs["group_size"] = group_size
    return record(GROUPED_GATHER, {"t": t, "indices": indices}, attrs, ["groupedgather_out"])[0]


# scatter --------------------------------------------------------------------------------


def _scatter_infer(t: Any, indices: Any, values: Any, *, axis: int) -> list:
    _check_int("scatter", "indices", indices)
    if not len(t.shape) == len(indices.shape) == len(values.shape):
        raise core_error(
            f"scatter: `t` {t.shape}, `indices` {indices.shape} and `values` {values.shape} "
            "must all have the same rank."
        )
    if indices.shape != values.shape:
        raise core_error(
            f"scatter: `indices` {indices.shape} and `values` {values.shape} must have the "
            "same shape (one index per value)."
        )
    if any(i > d for k, (i, d) in enumerate(zip(indices.shape, t.shape)) if k != axis):
        raise core_error(
            f"scatter: `indices` {indices.shape} is larger than `t` {t.shape} outside axis {axis}."
        )
    if values.dtype is not t.dtype:
        raise core_error(
            f"scatter: `values` has dtype {values.dtype.name} but `t` has {t.dtype.name}; "
            "cast one of them."
        )
    return [t]


def _scatter(x: Any, idx: Any, values: Any, *, axis: int) -> Any:
    return x.at[_element_positions(_as_int32(idx), axis)].set(values, mode="drop")


SCATTER = define("scatter", "Scatter", _scatter_infer, _scatter, nondiff_inputs=(1,))


def scatter(
    t: Tensor,
    indices: Tensor,
    values: Tensor,
    axis: int = 0,
    available_memory_proportion: float | None = None,
) -> Tensor:
    """A copy of ``t`` with ``values`` written at ``indices`` along ``axis``.

    This is ONNX ScatterElements.

    ``t``, ``indices`` and ``values`` have the same rank and ``indices.shape ==
    values.shape``. For a 2-D example with ``axis=0``:
    ``out[indices[i][j]][j] = values[i][j]``. Negative indices count from the end of the
    axis; indices still out of range are ignored. With repeated indices one of the
    written values wins (unspecified which, as in ONNX).

    Raises:
        TypeError: ``indices`` is not an integer tensor.
        PopXLException: ranks, shapes or dtypes that do not fit.

    See also: ``torch.Tensor.scatter``, ``jax.numpy.ndarray.at[].set``.
    """
    check_in_graph(context.get_current_graph(), t=t, indices=indices, values=values)
    attrs = {"axis": normalize_axis(axis, t.rank)}
    inputs = {"t": t, "indices": indices, "values": values}
    return record(SCATTER, inputs, attrs, ["scatter_out"])[0]


def _scatter_index_shape(
    indices: tuple[int, ...], data: tuple[int, ...], axis: int, broadcast: bool
) -> tuple[int, ...]:
    """The indices' shape padded with 1s to ``data``'s rank (a vector lands on ``axis``)."""
    if len(indices) > len(data):
        raise core_error(
            f"scatter_reduce: `indices` has rank {len(indices)}, more than `data` "
            f"(rank {len(data)})."
        )
    if indices == data:
        return indices
    expanded = indices
    if len(indices) == 1:
        expanded = (1,) * axis + indices
    expanded = expanded + (1,) * (len(data) - len(expanded))
    fits = [e in (1, d) if broadcast else e <= d for e, d in zip(expanded, data)]
    if not all(fits):
        rule = "broadcast to" if broadcast else "fit inside"
        raise core_error(
            f"scatter_reduce: `indices` of shape {indices} (expanded to {expanded}) does not "
            f"{rule} `data` of shape {data} with axis={axis}. Give indices of data's shape or "
            "a vector with one index per slice along axis."
        )
    return expanded


def _scatter_source_shape(data: Any, indices: Any, axis: int, broadcast: bool) -> tuple:
    expanded = _scatter_index_shape(indices.shape, data.shape, axis, broadcast)
    return data.shape if broadcast else expanded


def _scatter_reduce_infer(
    data: Any,
    indices: Any,
    *initial: Any,
    reduction: str,
    axis: int,
    axis_size: int,
    enable_index_broadcast: bool,
) -> list:
    _check_int("scatter_reduce", "indices", indices)
    source = _scatter_source_shape(data, indices, axis, enable_index_broadcast)
    if not initial:
        return [spec(source[:axis] + (axis_size,) + source[axis + 1 :], data.dtype)]
    init = initial[0]
    if init.dtype is not data.dtype:
        raise core_error(
            f"scatter_reduce: `initial_values` has dtype {init.dtype.name} but `data` has "
            f"{data.dtype.name}."
        )
    if len(init.shape) != len(source) or any(
        i < s for k, (i, s) in enumerate(zip(init.shape, source)) if k != axis
    ):
        raise core_error(
            f"scatter_reduce: `initial_values` of shape {init.shape} cannot receive `data` "
            f"of shape {source} along axis {axis}: same rank needed and no smaller "
            "dimension outside axis."
        )
    return [init]


def _reduction_identity(dtype: Any, reduction: str) -> Any:
    if reduction in ("sum", "none"):
        return 0
    if dtype == jnp.bool_:
        return reduction == "min"
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        return info.max if reduction == "min" else info.min
    return np.inf if reduction == "min" else -np.inf


def _scatter_reduce(
    data: Any,
    idx: Any,
    *initial: Any,
    reduction: str,
    axis: int,
    axis_size: int,
    enable_index_broadcast: bool,
) -> Any:
    expanded = _scatter_index_shape(idx.shape, data.shape, axis, enable_index_broadcast)
    idx = _as_int32(idx).reshape(expanded)
    if enable_index_broadcast:
        idx = jnp.broadcast_to(idx, data.shape)
    else:
        data = data[tuple(slice(0, e) for e in expanded)]
    if initial:
        out = initial[0]
    else:
        shape = data.shape[:axis] + (axis_size,) + data.shape[axis + 1 :]
        out = jnp.full(shape, _reduction_identity(data.dtype, reduction), data.dtype)
    idx = jnp.where(idx < 0, out.shape[axis], idx)  # negative indices are out of range
    ref = out.at[_element_positions(idx, axis)]
    update = {"sum": ref.add, "min": ref.min, "max": ref.max, "none": ref.set}[reduction]
    return update(data, mode="drop")


SCATTER_REDUCE = define(
    "scatter_reduce",
    "ScatterReduce",
    _scatter_reduce_infer,
    _scatter_reduce,
    nondiff_inputs=(1,),
)


def scatter_reduce(
    data: Tensor,
    indices: Tensor,
    reduction: Literal["sum", "min", "max", "none"],
    initial_values: Tensor | None = None,
    axis: int = 0,
    axis_size: int | None = None,
    enable_index_broadcast: bool = True,
    available_memory_proportion: float | None = None,
) -> Tensor:
    """Reduce ``data`` into ``axis_size`` slots along ``axis``, chosen by ``indices``.

    Element ``data[i0, .., ik, .., in]`` (``ik`` on ``axis``) is combined into
    ``out[i0, .., indices[i0, .., ik, .., in], .., in]`` with ``reduction``: ``"sum"``
    adds, ``"min"``/``"max"`` keep the extreme, ``"none"`` overwrites (one of repeated
    writes wins, unspecified which).

    ``indices`` either has ``data``'s shape, or is broadcast to it: a vector of length
    ``data.shape[axis]`` names one slot per slice along ``axis``; a lower-rank tensor is
    padded with trailing 1s. With ``enable_index_broadcast=False`` a smaller ``indices``
    is not broadcast; only the leading ``data[:indices.shape]`` block is scattered
    (``torch.scatter_reduce`` semantics) and the output takes that block's shape.
    Partial broadcasts (any dims of size 1), which the original rejected, are accepted.

    The output starts from ``initial_values`` (its shape and dtype) if given, else it has
    ``data``'s shape with ``axis_size`` on ``axis`` and starts from the identity of the
    reduction: 0 for ``sum``/``none``, +inf/-inf for float ``min``/``max`` (the integer
    dtype's largest/smallest value for ints), so a slot that receives nothing keeps that
    identity (the original filled it with the dtype's highest/lowest finite value).
    Indices outside ``[0, output.shape[axis])`` (negatives included) are ignored.

    Args:
        data: the values to scatter.
        indices: integer slot indices (see above for the shapes accepted).
        reduction: ``"sum"``, ``"min"``, ``"max"`` or ``"none"``.
        initial_values: the tensor to reduce into (a copy of it is returned).
        axis: the scatter axis (negative counts from the end).
        axis_size: the output size along ``axis``; defaults to
            ``initial_values.shape[axis]``.
        enable_index_broadcast: broadcast ``indices`` to ``data``'s shape (see above).
        available_memory_proportion: an IPU memory-planning hint; no effect here.

    Raises:
        ValueError: neither ``initial_values`` nor ``axis_size`` given, an ``axis_size``
            below 1 or disagreeing with ``initial_values``, an unknown ``reduction``.
        PopXLException: shapes or dtypes that do not fit.

    See also: ``torch.Tensor.scatter_reduce``, ``jax.numpy.ndarray.at[].add/min/max``.
    """
    inputs = {"data": data, "indices": indices}
    if initial_values is not None:
        inputs["initial_values"] = initial_values
    check_in_graph(context.get_current_graph(), **inputs)
    if reduction not in SCATTER_REDUCTIONS:
        raise ValueError(
            f"scatter_reduce: the reduction must be one of {list(SCATTER_REDUCTIONS)}, "
            f"got {reduction!r}."
        )
    if initial_values is None and axis_size is None:
        raise ValueError(
            "scatter_reduce: one of initial_values and axis_size must be specified (the "
            "output size along axis is not known otherwise)."
        )
    ax = normalize_axis(axis, data.rank)
    size = _scatter_axis_size(initial_values, ax, axis_size)
    attrs = {
        "reduction": reduction,
        "axis": ax,
        "axis_size": size,
        "enable_index_broadcast": bool(enable_index_broadcast),
    }
    return record(SCATTER_REDUCE, inputs, attrs, ["scatterreduce_out"])[0]


def _scatter_axis_size(initial_values: Tensor | None, axis: int, axis_size: int | None) -> int:
    if initial_values is not None:
        if initial_values.rank <= axis:
            raise core_error(
                f"scatter_reduce: `initial_values` of shape {initial_values.shape} has no "
                f"axis {axis}."
            )
        if axis_size is not None and int(axis_size) != initial_values.shape[axis]:
            raise ValueError(
                f"scatter_reduce: axis_size={axis_size} disagrees with initial_values' size "
                f"{initial_values.shape[axis]} along axis {axis}; drop one of them."
            )
        return initial_values.shape[axis]
    if int(axis_size) < 1:  # type: ignore[arg-type]
        raise ValueError(f"scatter_reduce: axis_size must be >= 1, got {axis_size}.")
    return int(axis_size)  # type: ignore[arg-type]


# onehot ---------------------------------------------------------------------------------


def _onehot_infer(t: Any, num_classes: Any, values: Any, *, depth: int, axis: int) -> list:
    _check_int("onehot", "t", t)
    if int(np.prod(values.shape)) != 2:
        raise core_error(
            f"onehot: `values` must hold exactly 2 elements [off, on], got shape {values.shape}."
        )
    return [spec(t.shape[:axis] + (depth,) + t.shape[axis:], values.dtype)]


def _onehot(x: Any, num_classes: Any, values: Any, *, depth: int, axis: int) -> Any:
    idx = _as_int32(x)
    idx = jnp.where(idx < 0, idx + depth, idx)
    rank = idx.ndim + 1
    classes = jnp.arange(depth, dtype=jnp.int32).reshape(
        (1,) * axis + (depth,) + (1,) * (rank - axis - 1)
    )
    off, on = values.reshape(2)[0], values.reshape(2)[1]
    return jnp.where(jnp.expand_dims(idx, axis) == classes, on, off)


ONEHOT = define("onehot", "OneHot", _onehot_infer, _onehot, nondiff_inputs=(0, 1))


def _depth(num_classes: Tensor) -> int:
    if not isinstance(num_classes, Constant):
        raise ValueError(NUM_CLASSES_MSG.format(what=f"a {type(num_classes).__name__}"))
    data = np.asarray(num_classes.data)
    if data.size != 1 or not np.issubdtype(data.dtype, np.integer) or data.reshape(()) < 1:
        raise ValueError(NUM_CLASSES_MSG.format(what=f"{data.dtype} data {data.tolist()}"))
    return int(data.reshape(()))


def onehot(t: Tensor, num_classes: Tensor, values: Tensor, axis: int) -> Tensor:
    """One-hot encode the integer tensor ``t`` (ONNX OneHot).

    The output has a new dimension of size ``num_classes`` inserted at ``axis`` (``-1``:
    last; negative axes count over the output's rank ``t.rank + 1``) and ``values``' dtype:
    ``out[..., c, ...] = values[1] if t[...] == c else values[0]``. Negative entries of
    ``t`` in ``[-num_classes, -1]`` count from the end; entries out of range give an
    all-``off`` row.

    Args:
        t: integer indices.
        num_classes: a ``popxl.constant`` holding one positive integer; its value is read
            when the op is created because it fixes the output shape.
        values: 2 elements ``[off, on]``.
        axis: where the one-hot dimension goes.

    Raises:
        ValueError: ``num_classes`` not a constant positive integer, ``axis`` out of range.
        TypeError: ``t`` is not an integer tensor.
        PopXLException: ``values`` does not hold 2 elements.

    See also: ``jax.nn.one_hot``, ``torch.nn.functional.one_hot``.
    """
    inputs = {"t": t, "num_classes": num_classes, "values": values}
    check_in_graph(context.get_current_graph(), **inputs)
    attrs = {"depth": _depth(num_classes), "axis": normalize_axis(axis, t.rank + 1)}
    return record(ONEHOT, inputs, attrs, ["onehot_out"])[0]
