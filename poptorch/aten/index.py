"""Indexing: advanced indexing and index_put, index_select, gather/scatter (with
reductions), masked_scatter, topk/sort, cumulative sums and products.

Advanced indexing follows numpy's rules, which are torch's: ``None`` entries of an index
list are full slices, index tensors broadcast together, and the indexed dimensions go
first when the index tensors are not adjacent. JAX indexes with those same rules, so
``aten.index.Tensor`` and ``aten.index_put`` are JAX functions of the index tuple.

Gradients are torch's: an overwritten position passes no gradient to the tensor written
into, and every value written (repeated indices included) gets the gradient of the position
it was written to (``torch.index_put``/``scatter`` backward), not only the write that won.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException
from torch.ops import aten

import popxl
from popxl import ops

from .._log import logger
from .fx import args_of
from .registry import NodeContext, lowering

# Set by the capture (``poptorch.capture.index_expansion``) on a gather or scatter whose index
# it read before an expansion: the expanded shape.
EXPANDED = "poptorch_index_expanded_to"


# The target of a node the capture makes from several scatters of one tensor by one index
# (``poptorch.capture.scatter_groups``); lowered below as one op.
def grouped_scatter(
    x: Any, dim: int, index: Any, srcs: list, reduce: str, include_self: bool
) -> Any:
    """The target of a grouped node: ``[scatter_reduce(x, dim, index, s) for s in srcs]``."""
    return tuple(x.scatter_reduce(dim, index, s, reduce, include_self=include_self) for s in srcs)


def _dim(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _is_mask(node_arg: Any) -> bool:
    """Whether an index the FX node received is a mask (bool, or uint8 as torch reads it)."""
    dtype = node_arg.meta["val"].dtype if hasattr(node_arg, "meta") else None
    return dtype in (torch.bool, torch.uint8)


# Overwriting with torch's gradient ---------------------------------------------------------


def _sum_to(g: Any, shape: tuple[int, ...]) -> Any:
    """``g`` summed over the dimensions broadcasting added to (or stretched in) ``shape``."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _where_of(arrays: tuple, layout: tuple[bool, ...]) -> tuple:
    """The numpy index of an ATen index list: ``None`` entries (False) are full slices."""
    it = iter(arrays)
    return tuple(next(it) if present else slice(None) for present in layout)


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def _overwrite(x: Any, v: Any, arrays: tuple, layout: tuple[bool, ...]) -> Any:
    """``x`` with ``v`` written at the index ``(arrays, layout)``."""
    return x.at[_where_of(arrays, layout)].set(v.astype(x.dtype))


def _overwrite_fwd(x: Any, v: Any, arrays: tuple, layout: tuple[bool, ...]) -> tuple:
    return _overwrite(x, v, arrays, layout), (arrays, v)


def _overwrite_bwd(layout: tuple[bool, ...], res: tuple, g: Any) -> tuple:
    arrays, v = res
    where = _where_of(arrays, layout)
    grad_x = g.at[where].set(0)
    grad_v = _sum_to(g[where], v.shape).astype(v.dtype)
    return grad_x, grad_v, tuple(None for _ in arrays)


_overwrite.defvjp(_overwrite_fwd, _overwrite_bwd)


# Advanced indexing -------------------------------------------------------------------------


def _index(x: Any, *idx: Any, layout: tuple[bool, ...]) -> Any:
    return x[_where_of(idx, layout)]


def _layout(indices: list) -> tuple[bool, ...]:
    return tuple(i is not None for i in indices)


class MaskedIndexError(DynamicOutputShapeException):
    """``x[mask]``: an output shape known only at run time. The type torch's fake tensors
    raise for it (``DynamicOutputShapeException``), with a message saying what to do."""

    def __init__(self, where: str) -> None:
        super().__init__(aten.index.Tensor)
        self.where = where

    def __str__(self) -> str:
        return (
            f"x[mask] with a boolean mask (in {self.where}) selects a number of elements "
            "known only at run time; a compiled program needs fixed shapes: use "
            "torch.where(mask, x, y) or x * mask instead."
        )


def _refuse_masks(ctx: NodeContext) -> None:
    if any(a is not None and _is_mask(a) for a in args_of(ctx.node)[1]):
        raise MaskedIndexError(ctx.where())


@lowering(aten.index.Tensor)
def _lower_index(ctx: NodeContext, x: popxl.Tensor, indices: list) -> Any:
    """``x[i0, :, i2]``: integer index tensors (``None`` entries are full slices)."""
    _refuse_masks(ctx)
    arrays = [i for i in indices if i is not None]
    nondiff = tuple(range(1, len(arrays) + 1))
    return ctx.jax("index", _index, x, *arrays, nondiff=nondiff, layout=_layout(indices))


def _index_put(x: Any, v: Any, *idx: Any, layout: tuple[bool, ...], accumulate: bool) -> Any:
    if accumulate:
        return x.at[_where_of(idx, layout)].add(v.astype(x.dtype))
    return _overwrite(x, v, idx, layout)


def _masked_put(x: Any, mask: Any, v: Any, first: int, accumulate: bool) -> Any:
    """``x[:, .., mask] = v`` (``first`` full slices before the mask): ``v`` broadcast to the
    selected elements, in order; a length-1 (or missing) selection axis repeats one value."""
    mask = mask.astype(bool)
    m = mask.ndim
    lead, rest = x.shape[:first], x.shape[first + m :]
    v = v.astype(x.dtype).reshape((1,) * (first + 1 + len(rest) - v.ndim) + v.shape)
    count = v.shape[first]
    v = jnp.broadcast_to(v, lead + (count,) + rest)
    if count == 1:
        full = jnp.expand_dims(v, tuple(range(first + 1, first + m)))
    else:
        order = jnp.clip(jnp.cumsum(mask.reshape(-1)) - 1, 0, count - 1).reshape(mask.shape)
        full = jnp.take(v, order, axis=first)
    full = jnp.broadcast_to(full, x.shape)
    keep = mask.reshape((1,) * first + mask.shape + (1,) * len(rest))
    if accumulate:
        return x + jnp.where(keep, full, jnp.zeros_like(full))
    return jnp.where(keep, full, x)


def _mask_position(ctx: NodeContext, indices: list) -> int | None:
    """Where a boolean mask sits in an index list, or None; only ``[None.., mask]`` is
    supported."""
    node_indices = args_of(ctx.node)[1]
    masks = [k for k, a in enumerate(node_indices) if a is not None and _is_mask(a)]
    if not masks:
        return None
    k = masks[0]
    if len(masks) > 1 or any(i is not None for j, i in enumerate(indices) if j != k):
        raise NotImplementedError(
            "index_put with a boolean mask is supported as x[mask] = v or x[:, mask] = v "
            "(the mask the only index); mixing masks with index tensors is not."
        )
    return k


@lowering(aten.index_put.default)
def _lower_index_put(
    ctx: NodeContext, x: popxl.Tensor, indices: list, values: Any, accumulate: bool = False
) -> Any:
    """``x[i0, :, i2] = v`` (or ``+=`` with ``accumulate``), and ``x[mask] = v``."""
    values = ctx.tensor(values, x.dtype)
    k = _mask_position(ctx, indices)
    if k is not None:
        return ctx.jax(
            "masked_put",
            _masked_put,
            x,
            indices[k],
            values,
            nondiff=(1,),
            first=k,
            accumulate=bool(accumulate),
        )
    arrays = [i for i in indices if i is not None]
    if len(arrays) == 1 and not accumulate:
        logger.debug(
            "index_put: Using vectorized ScatterReduce with none reduction (one index "
            "tensor writes whole slices)"
        )
    nondiff = tuple(range(2, len(arrays) + 2))
    return ctx.jax(
        "index_put",
        _index_put,
        x,
        values,
        *arrays,
        nondiff=nondiff,
        layout=_layout(indices),
        accumulate=bool(accumulate),
    )


@lowering(aten.index_select.default)
def _lower_index_select(ctx: NodeContext, x: popxl.Tensor, dim: int, index: popxl.Tensor) -> Any:
    if x.rank == 0:
        return ops.reshape(ops.gather(ops.reshape(x, [1]), ops.reshape(index, [-1])), [])
    if index.rank == 0:
        index = ops.reshape(index, [1])
    return ops.gather(x, index, _dim(dim, x.rank))


# gather / scatter --------------------------------------------------------------------------


def _region(shape: tuple[int, ...], index_shape: tuple[int, ...], axis: int) -> tuple:
    """The part of a tensor of ``shape`` a gather/scatter index of ``index_shape`` addresses:
    every axis cut to the index's length except ``axis``."""
    return tuple(slice(None) if a == axis else slice(0, n) for a, n in enumerate(index_shape))


def _gather(x: Any, index: Any, axis: int, expanded: tuple | None = None) -> Any:
    """``expanded``: the shape ``index`` stands for, repeated along its other dimension
    (whole rows are taken: ``poptorch/capture/index_expansion.py``)."""
    if expanded is not None:
        part = x[_region(x.shape, expanded, axis)]
        return jnp.take(part, index.reshape(-1), axis=axis)
    if x.ndim == 0:
        return x.reshape(index.shape)
    part = x[_region(x.shape, index.shape, axis)]
    return jnp.take_along_axis(part, index, axis=axis)


def _expanded(ctx: NodeContext) -> tuple | None:
    """The shape of the index a gather/scatter reads unexpanded, if the capture rewrote it."""
    return ctx.node.meta.get(EXPANDED)


@lowering(aten.gather.default)
def _lower_gather(
    ctx: NodeContext, x: popxl.Tensor, dim: int, index: popxl.Tensor, sparse_grad: bool = False
) -> Any:
    """torch.gather: ``out[i][j] = x[index[i][j]][j]`` (dim 0); ``index`` may be smaller
    than ``x`` in the other dimensions."""
    expanded = _expanded(ctx)
    attrs: dict[str, Any] = {"expanded": expanded} if expanded is not None else {}
    return ctx.jax("gather", _gather, x, index, nondiff=(1,), axis=_dim(dim, x.rank), **attrs)


def _scatter_where(index: Any, axis: int) -> tuple:
    """The numpy index that writes element ``k`` of ``index`` to ``index[k]`` along ``axis``
    and ``k``'s own position along the others."""
    grids = jnp.meshgrid(*[jnp.arange(n) for n in index.shape], indexing="ij", sparse=True)
    grids[axis] = index
    return tuple(jnp.broadcast_to(g, index.shape) for g in grids)


def _dense_reduce(part: Any, index: Any, src: Any, reduce: str, include_self: bool) -> Any:
    """Scatter-reduce of ``src`` into ``part`` along the last axis by comparing each index
    with every destination; exact gradients (ties share them, as torch) at the cost of an
    ``index.size * part.shape[-1]`` intermediate."""
    n = part.shape[-1]
    hit = index[..., :, None] == jnp.arange(n)  # (..., K, N)
    touched = hit.any(axis=-2)
    count = hit.sum(axis=-2).astype(part.dtype)
    if reduce in ("amax", "amin"):
        fill = _extreme(part.dtype, reduce)
        cands = jnp.where(hit, src[..., :, None], fill)
        if include_self:
            cands = jnp.concatenate([part[..., None, :], cands], axis=-2)
        best = cands.max(axis=-2) if reduce == "amax" else cands.min(axis=-2)
        return best if include_self else jnp.where(touched, best, part)
    if reduce == "prod":
        prod = jnp.where(hit, src[..., :, None], jnp.ones((), part.dtype)).prod(axis=-2)
        return part * prod if include_self else jnp.where(touched, prod, part)
    total = jnp.where(hit, src[..., :, None], jnp.zeros((), part.dtype)).sum(axis=-2)
    if reduce == "sum":
        return part + total if include_self else jnp.where(touched, total, part)
    # mean
    if include_self:
        total, count = total + part, count + 1
    mean = _divide(total, jnp.maximum(count, 1))
    return mean if include_self else jnp.where(touched, mean, part)


def _extreme(dtype: Any, reduce: str) -> Any:
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.asarray(-jnp.inf if reduce == "amax" else jnp.inf, dtype)
    info = jnp.iinfo(dtype) if dtype != jnp.bool_ else None
    if info is None:
        return jnp.asarray(reduce == "amin", dtype)
    return jnp.asarray(info.min if reduce == "amax" else info.max, dtype)


def _divide(total: Any, count: Any) -> Any:
    if jnp.issubdtype(total.dtype, jnp.floating):
        return total / count
    return jnp.floor_divide(total, count)


def _scatter_rows(
    x: Any, rows: Any, src: Any, axis: int, reduce: str, include_self: bool, shape: tuple
) -> Any:
    """A sum or mean scatter of whole rows: ``src``'s row ``k`` (along ``axis``) into row
    ``rows[k]`` of ``x``; ``shape`` is the region of ``src`` and ``x`` the rows span."""
    region = _region(x.shape, shape, axis)
    part = jnp.moveaxis(x[region], axis, 0)
    rows = rows.reshape(-1)
    moved = jnp.moveaxis(src, axis, 0)
    total = jnp.zeros_like(part).at[rows].add(moved)
    count = jnp.zeros(part.shape[:1], part.dtype).at[rows].add(1)
    count = count.reshape(count.shape + (1,) * (part.ndim - 1))
    if reduce == "sum":
        done = part + total if include_self else jnp.where(count > 0, total, part)
    elif include_self:
        done = _divide(total + part, count + 1)
    else:
        done = jnp.where(count > 0, _divide(total, jnp.maximum(count, 1)), part)
    return x.at[region].set(jnp.moveaxis(done, 0, axis))


def _scatter(
    x: Any,
    index: Any,
    src: Any,
    axis: int,
    reduce: str,
    include_self: bool,
    expanded: tuple | None = None,
) -> Any:
    """``expanded``: the shape ``index`` stands for (see ``_gather``); sums and means then
    move whole rows, other reductions expand the index here."""
    if expanded is not None:
        src = jnp.broadcast_to(src.astype(x.dtype), src.shape if src.ndim else expanded)
        src = src[tuple(slice(0, n) for n in expanded)]
        if reduce in ("sum", "mean"):
            return _scatter_rows(x, index, src, axis, reduce, include_self, expanded)
        index = jnp.broadcast_to(index, expanded)
    src = jnp.broadcast_to(src.astype(x.dtype), src.shape if src.ndim else index.shape)
    src = src[tuple(slice(0, n) for n in index.shape)]
    if x.ndim == 0:
        x, index, src = x.reshape(1), index.reshape(1), src.reshape(1)
        return _scatter(x, index, src, 0, reduce, include_self).reshape(())
    if reduce == "none":
        return _overwrite(x, src, _scatter_where(index, axis), (True,) * x.ndim)
    if reduce == "sum" and include_self:
        return x.at[_scatter_where(index, axis)].add(src)
    region = _region(x.shape, index.shape, axis)
    part = jnp.moveaxis(x[region], axis, -1)
    done = _dense_reduce(
        part, jnp.moveaxis(index, axis, -1), jnp.moveaxis(src, axis, -1), reduce, include_self
    )
    return x.at[region].set(jnp.moveaxis(done, -1, axis))


_TORCH_REDUCE = {None: "none", "add": "sum", "multiply": "prod"}
_SCATTER_REDUCE = ("sum", "prod", "mean", "amax", "amin")


def _record_scatter(
    ctx: NodeContext,
    x: popxl.Tensor,
    dim: int,
    index: popxl.Tensor,
    src: Any,
    reduce: str,
    include_self: bool = True,
) -> Any:
    src = ctx.tensor(src, x.dtype)
    expanded = _expanded(ctx)
    attrs: dict[str, Any] = {"expanded": expanded} if expanded is not None else {}
    return ctx.jax(
        "scatter",
        _scatter,
        x,
        index,
        src,
        nondiff=(1,),
        axis=_dim(dim, x.rank),
        reduce=reduce,
        include_self=bool(include_self),
        **attrs,
    )


def _torch_reduce(reduce: str | None) -> str:
    if reduce not in _TORCH_REDUCE:
        raise ValueError(f"scatter: reduce must be 'add' or 'multiply', got {reduce!r}.")
    return _TORCH_REDUCE[reduce]


@lowering(aten.scatter.src, aten.scatter.value)
def _lower_scatter(ctx: NodeContext, x: popxl.Tensor, dim: int, index: Any, src: Any) -> Any:
    """``x.scatter(dim, index, src)``: ``out[index[i][j]][j] = src[i][j]`` (dim 0)."""
    return _record_scatter(ctx, x, dim, index, src, "none")


@lowering(aten.scatter.reduce, aten.scatter.value_reduce)
def _lower_scatter_reduce_legacy(
    ctx: NodeContext, x: popxl.Tensor, dim: int, index: Any, src: Any, reduce: str | None = None
) -> Any:
    return _record_scatter(ctx, x, dim, index, src, _torch_reduce(reduce))


@lowering(aten.scatter_add.default)
def _lower_scatter_add(ctx: NodeContext, x: popxl.Tensor, dim: int, index: Any, src: Any) -> Any:
    return _record_scatter(ctx, x, dim, index, src, "sum")


@lowering(aten.scatter_reduce.two)
def _lower_scatter_reduce(
    ctx: NodeContext,
    x: popxl.Tensor,
    dim: int,
    index: Any,
    src: Any,
    reduce: str,
    include_self: bool = True,
) -> Any:
    if reduce not in _SCATTER_REDUCE:
        raise ValueError(
            f"scatter_reduce: reduce must be one of {', '.join(_SCATTER_REDUCE)}, got {reduce!r}."
        )
    return _record_scatter(ctx, x, dim, index, src, reduce, include_self)


def _grouped_scatter(
    x: Any,
    index: Any,
    srcs: Any,
    axis: int,
    reduce: str,
    include_self: bool,
    group_size: int,
    expanded: tuple | None = None,
) -> Any:
    """``_scatter`` of each of the ``group_size`` stacked sources ``srcs`` into ``x``."""
    one = partial(_scatter, axis=axis, reduce=reduce, include_self=include_self, expanded=expanded)
    return jax.vmap(one, in_axes=(None, None, 0))(x, index, srcs)


@lowering(grouped_scatter)
def _lower_grouped_scatter(
    ctx: NodeContext,
    x: popxl.Tensor,
    dim: int,
    index: popxl.Tensor,
    srcs: list,
    reduce: str,
    include_self: bool,
) -> tuple:
    """Scatter-reduces of one tensor by one index (``_capture/scatter_groups.py``): one op
    with ``group_size`` sources, then a slice per result."""
    expanded = _expanded(ctx)
    attrs: dict[str, Any] = {"expanded": expanded} if expanded is not None else {}
    stacked = ops.concat([ops.reshape(ctx.tensor(s, x.dtype), (1, *s.shape)) for s in srcs], 0)
    n = len(srcs)
    out = ctx.jax(
        "grouped_scatter",
        _grouped_scatter,
        x,
        index,
        stacked,
        nondiff=(1,),
        outputs=[((n, *x.shape), x.dtype)],
        axis=_dim(dim, x.rank),
        reduce=reduce,
        include_self=bool(include_self),
        group_size=n,
        **attrs,
    )
    return tuple(ops.reshape(ops.slice(out, [i], [i + 1], axis=[0]), x.shape) for i in range(n))


def _index_reduce(x: Any, index: Any, src: Any, axis: int, reduce: str, include_self: bool) -> Any:
    """index_reduce as a scatter_reduce whose index is ``index`` along ``axis`` for every
    element of ``src``."""
    view = [1] * src.ndim
    view[axis] = index.shape[0]
    full = jnp.broadcast_to(index.reshape(view), src.shape)
    return _scatter(x, full, src, axis, reduce, include_self)


_INDEX_REDUCE = ("prod", "mean", "amax", "amin")


@lowering(aten.index_reduce.default)
def _lower_index_reduce(
    ctx: NodeContext,
    x: popxl.Tensor,
    dim: int,
    index: popxl.Tensor,
    source: Any,
    reduce: str,
    *,
    include_self: bool = True,
) -> Any:
    """``x.index_reduce_(dim, index, source, reduce)``: slice ``i`` of ``source`` along
    ``dim`` is reduced into slice ``index[i]`` of ``x``."""
    if reduce not in _INDEX_REDUCE:
        raise ValueError(
            f"index_reduce: reduce must be one of {', '.join(_INDEX_REDUCE)}, got {reduce!r}."
        )
    if x.rank == 0:
        x, source = ops.reshape(x, [1]), ops.reshape(ctx.tensor(source, x.dtype), [1])
        index = ops.reshape(index, [1])
        out = _lower_index_reduce(ctx, x, 0, index, source, reduce, include_self=include_self)
        return ops.reshape(out, [])
    return ctx.jax(
        "index_reduce",
        _index_reduce,
        x,
        ops.reshape(index, [-1]),
        ctx.tensor(source, x.dtype),
        nondiff=(1,),
        axis=_dim(dim, x.rank),
        reduce=reduce,
        include_self=bool(include_self),
        outputs=[(tuple(x.shape), x.dtype)],
    )


def _masked_scatter(x: Any, mask: Any, source: Any) -> Any:
    x, mask = jnp.broadcast_arrays(x, mask.astype(bool))
    flat = source.reshape(-1).astype(x.dtype)
    order = jnp.clip(jnp.cumsum(mask.reshape(-1)) - 1, 0, flat.shape[0] - 1)
    return jnp.where(mask, flat[order].reshape(x.shape), x)


@lowering(aten.masked_scatter.default)
def _lower_masked_scatter(ctx: NodeContext, x: popxl.Tensor, mask: Any, source: Any) -> Any:
    """The positions where ``mask`` is true take ``source``'s elements in order."""
    if int(np.prod(source.shape)) == 0:
        return ctx.jax("expand_to_mask", _expand_like_mask, x, mask, nondiff=(1,))
    return ctx.jax("masked_scatter", _masked_scatter, x, mask, source, nondiff=(1,))


def _expand_like_mask(x: Any, mask: Any) -> Any:
    return jnp.broadcast_arrays(x, mask)[0]


# Sorting -----------------------------------------------------------------------------------


@lowering(aten.topk.default)
def _lower_topk(
    ctx: NodeContext,
    x: popxl.Tensor,
    k: int,
    dim: int = -1,
    largest: bool = True,
    sorted: bool = True,  # noqa: A002 (torch's name)
) -> tuple:
    if x.rank == 0:
        return ops.identity(x), ctx.constant(0, ctx.out_spec(1)[1])
    values, indices = ops.topk(x, int(k), _dim(dim, x.rank), bool(largest), bool(sorted))
    return values, ctx.tensor(indices, ctx.out_spec(1)[1])


def _sort(x: Any, axis: int, descending: bool) -> tuple:
    order = jnp.argsort(x, axis=axis, stable=True, descending=descending)
    return jnp.take_along_axis(x, order, axis=axis), order.astype(jnp.int32)


@lowering(aten.sort.default)
def _lower_sort(ctx: NodeContext, x: popxl.Tensor, dim: int = -1, descending: bool = False) -> Any:
    """Values and indices; equal values keep their order (a stable sort, as torch's CPU
    sort), NaN last when ascending."""
    if x.rank == 0:
        return ops.identity(x), ctx.constant(0, ctx.out_spec(1)[1])
    return ctx.jax("sort", _sort, x, axis=_dim(dim, x.rank), descending=bool(descending))


@lowering(aten.sort.stable)
def _lower_sort_stable(
    ctx: NodeContext,
    x: popxl.Tensor,
    *,
    stable: bool | None = None,
    dim: int = -1,
    descending: bool = False,
) -> Any:
    return _lower_sort(ctx, x, dim, descending)


def _kth(x: Any, k: int, axis: int, keepdim: bool) -> tuple:
    values, order = _sort(x, axis, descending=False)
    value = jax.lax.slice_in_dim(values, k - 1, k, axis=axis)
    index = jax.lax.slice_in_dim(order, k - 1, k, axis=axis)
    if not keepdim:
        value, index = jnp.squeeze(value, axis), jnp.squeeze(index, axis)
    return value, index


@lowering(aten.kthvalue.default)
def _lower_kthvalue(
    ctx: NodeContext, x: popxl.Tensor, k: int, dim: int = -1, keepdim: bool = False
) -> Any:
    """The ``k``-th smallest value along ``dim`` (from 1) and its index: the stable sort's,
    so of equal values the first."""
    if x.rank == 0:
        if int(k) != 1:
            raise IndexError(f"kthvalue(): selected number k={k} out of range for a 0-d tensor")
        return ops.identity(x), ctx.constant(0, ctx.out_spec(1)[1])
    axis = _dim(dim, x.rank)
    if not 1 <= int(k) <= x.shape[axis]:
        raise IndexError(
            f"kthvalue(): selected number k={k} out of range for dimension {dim} of size "
            f"{x.shape[axis]}"
        )
    return ctx.jax("kthvalue", _kth, x, k=int(k), axis=axis, keepdim=bool(keepdim))


# Bucketing --------------------------------------------------------------------------------


def _search(boundaries: Any, x: Any, right: bool, dtype: Any) -> Any:
    """For each ``x``, the index of its bucket in ``boundaries`` (sorted along the last
    axis; leading axes pair rows of ``boundaries`` with rows of ``x``). A binary search, as
    torch's: boundaries that are not sorted give torch's answers too."""
    side = "right" if right else "left"
    if boundaries.ndim <= 1:
        found = jnp.searchsorted(boundaries.reshape(-1), x, side=side, method="scan")
    else:
        row = partial(jnp.searchsorted, side=side, method="scan")
        for _ in range(boundaries.ndim - 1):
            row = jax.vmap(row)
        found = row(boundaries, x)
    return found.astype(dtype)


def _record_search(
    ctx: NodeContext, boundaries: popxl.Tensor, x: Any, right: bool, side: str | None
) -> Any:
    x = ctx.tensor(x, boundaries.dtype)
    right = bool(right) or side == "right"
    dtype = ctx.out_dtype.as_numpy()
    return ctx.jax("searchsorted", _search, boundaries, x, nondiff=(0, 1), right=right, dtype=dtype)


@lowering(aten.bucketize.Tensor, aten.bucketize.Scalar)
def _lower_bucketize(
    ctx: NodeContext,
    x: Any,
    boundaries: popxl.Tensor,
    *,
    out_int32: bool = False,
    right: bool = False,
) -> Any:
    """``torch.bucketize``: the bucket of each element of ``x`` among 1-D ``boundaries``
    (``right``: a value equal to a boundary goes to the bucket above it)."""
    return _record_search(ctx, boundaries, x, right, None)


@lowering(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def _lower_searchsorted(
    ctx: NodeContext,
    sorted_sequence: popxl.Tensor,
    x: Any,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: popxl.Tensor | None = None,
) -> Any:
    """``torch.searchsorted``: where each ``x`` would be inserted to keep each row of
    ``sorted_sequence`` sorted (``sorter``: the permutation that sorts it)."""
    if sorter is not None:
        sorted_sequence = ctx.jax(
            "gather",
            _gather,
            sorted_sequence,
            sorter,
            nondiff=(1,),
            outputs=[(sorted_sequence.shape, sorted_sequence.dtype)],
            axis=sorted_sequence.rank - 1,
        )
    return _record_search(ctx, sorted_sequence, x, right, side)


# Cumulative ops ----------------------------------------------------------------------------


@lowering(aten.cumsum.default)
def _lower_cumsum(ctx: NodeContext, x: popxl.Tensor, dim: int, dtype: Any = None) -> Any:
    x = ctx.tensor(x, ctx.out_dtype)
    if x.rank == 0:
        return ops.identity(x)
    return ops.cumsum(x, _dim(dim, x.rank))


def _cumprod(x: Any, axis: int) -> Any:
    return jnp.cumprod(x, axis=axis)


@lowering(aten.cumprod.default)
def _lower_cumprod(ctx: NodeContext, x: popxl.Tensor, dim: int, dtype: Any = None) -> Any:
    x = ctx.tensor(x, ctx.out_dtype)
    if x.rank == 0:
        return ops.identity(x)
    return ctx.jax("cumprod", _cumprod, x, axis=_dim(dim, x.rank))
