"""Shape and layout ATen ops: views, permutations, concatenation, splitting, slicing,
copies and casts.

Every tensor here is dense, so a torch *view* is a copy with the view's shape: the
records compute the values a view would show (torch's aliasing is resolved by
``torch.export``'s functionalization before the table sees the graph).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import torch
from torch.ops import aten

import popxl
from popxl import ops

from .fx import node_arg
from .registry import NodeContext, lowering


def _dim(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _dims(dims: Any, rank: int) -> tuple[int, ...]:
    if isinstance(dims, int):
        dims = [dims]
    return tuple(_dim(d, rank) for d in dims)


# Views -------------------------------------------------------------------------------------


@lowering(aten.view.default)
def _lower_view(ctx: NodeContext, x: popxl.Tensor, shape: Any) -> popxl.Tensor:
    """The node's inferred shape (``-1`` already resolved by torch)."""
    return ops.reshape(x, ctx.out_shape)


@lowering(aten.unsqueeze.default, aten.squeeze.dims)
def _lower_unsqueeze(ctx: NodeContext, x: popxl.Tensor, *dims: Any) -> popxl.Tensor:
    return ops.reshape(x, ctx.out_shape)


@lowering(aten.permute.default)
def _lower_permute(ctx: NodeContext, x: popxl.Tensor, dims: Any) -> popxl.Tensor:
    return ops.transpose(x, list(_dims(dims, x.rank)))


def _broadcast_to(x: Any, shape: tuple[int, ...]) -> Any:
    return jnp.broadcast_to(x, shape)


@lowering(aten.expand.default)
def _lower_expand(ctx: NodeContext, x: popxl.Tensor, size: Any, implicit: bool = False) -> Any:
    shape = ctx.out_shape
    if tuple(x.shape) == shape:
        return ops.identity(x)
    return ctx.jax("expand", _broadcast_to, x, shape=shape)


def _diagonal(x: Any, offset: int, dim1: int, dim2: int) -> Any:
    return jnp.diagonal(x, offset, dim1, dim2)


@lowering(aten.diagonal.default)
def _lower_diagonal(
    ctx: NodeContext, x: popxl.Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1
) -> Any:
    """The diagonal as the last dimension (as torch and numpy put it)."""
    a, b = _dim(dim1, x.rank), _dim(dim2, x.rank)
    return ctx.jax("diagonal", _diagonal, x, offset=int(offset), dim1=a, dim2=b)


def _strided_gather(x: Any, flat_index: tuple, shape: tuple[int, ...]) -> Any:
    return jnp.take(x.reshape(-1), np.asarray(flat_index, np.int32)).reshape(shape)


@lowering(aten.as_strided.default)
def _lower_as_strided(
    ctx: NodeContext, x: popxl.Tensor, size: Any, stride: Any, storage_offset: int | None = None
) -> Any:
    """A strided view of a contiguous tensor: element ``i`` reads flat position
    ``storage_offset + sum(i_k * stride_k)`` of the input. Only a contiguous input's storage
    is known (its elements in order), so other inputs are refused."""
    val = node_arg(ctx.node, 0).meta["val"]
    contiguous = val.is_contiguous() and val.storage_offset() == 0
    if not contiguous:
        raise NotImplementedError(
            "aten.as_strided is supported on a contiguous tensor only (the strides then "
            "address its elements in order); call .contiguous() on its input first."
        )
    shape = tuple(int(s) for s in size)
    offset = int(storage_offset or 0)
    flat = np.full(shape, offset, np.int64)
    for axis, step in enumerate(stride):
        view = [1] * len(shape)
        view[axis] = shape[axis]
        flat = flat + (np.arange(shape[axis]) * int(step)).reshape(view)
    numel = int(np.prod(x.shape))
    if flat.size and (flat.min() < 0 or flat.max() >= numel):
        raise ValueError(
            f"aten.as_strided of a tensor of {numel} elements with size {list(shape)}, stride "
            f"{list(stride)} and offset {offset} reads outside the tensor."
        )
    return ctx.jax(
        "as_strided", _strided_gather, x, flat_index=tuple(flat.reshape(-1).tolist()), shape=shape
    )


# Copies and casts --------------------------------------------------------------------------


@lowering(aten.clone.default)
def _lower_clone(ctx: NodeContext, x: popxl.Tensor, **_: Any) -> popxl.Tensor:
    return ops.identity(x)


@lowering(torch.ops.prims.copy_strided.default)
def _lower_copy_strided(ctx: NodeContext, x: popxl.Tensor, stride: Any) -> popxl.Tensor:
    """A copy with other strides, which torch's own decompositions leave in the graph to
    keep an output's memory layout (``lerp`` or ``index_fill`` of a non-contiguous tensor).
    Values here have no strides: a copy."""
    return ops.identity(x)


@lowering(aten.alias.default)
def _lower_alias(ctx: NodeContext, x: popxl.Tensor) -> popxl.Tensor:
    """``x[...]``, or ``x.detach()``: the capture runs without autograd, so ``detach``
    arrives as ``alias`` and only the node's ``original_aten`` tells them apart. A detached
    value passes no gradient back (``trainingModel``)."""
    if str(ctx.node.meta.get("original_aten")) == "aten.detach.default":  # a copy, not `is`
        return ops.detach(x)
    return ops.identity(x)


@lowering(aten._to_copy.default)
def _lower_to_copy(ctx: NodeContext, x: popxl.Tensor, **kwargs: Any) -> popxl.Tensor:
    """``Tensor.to(dtype)`` and friends: a cast (device and layout have no meaning here)."""
    dtype = ctx.out_dtype
    return ops.cast(x, dtype) if x.dtype != dtype else ops.identity(x)


@lowering(aten.copy.default)
def _lower_copy(ctx: NodeContext, dst: popxl.Tensor, src: Any, non_blocking: bool = False) -> Any:
    """``dst.copy_(src)`` made functional: ``src`` cast to ``dst``'s dtype and broadcast to
    its shape."""
    src = ctx.tensor(src, ctx.out_dtype)
    if tuple(src.shape) == ctx.out_shape:
        return ops.identity(src)
    return ctx.jax("expand", _broadcast_to, src, shape=ctx.out_shape)


# Joining and splitting ---------------------------------------------------------------------


@lowering(aten.cat.default)
def _lower_cat(ctx: NodeContext, tensors: list, dim: int = 0) -> popxl.Tensor:
    """torch.cat, with torch's type promotion of the parts and its legacy rule that 1-D
    empty tensors are skipped whatever the other parts' shapes."""
    dtype = ctx.out_dtype
    rank = len(ctx.out_shape)
    parts = [ctx.tensor(t, dtype) for t in tensors if not (t.rank == 1 and t.shape[0] == 0)]
    if not parts:
        return ctx.constant(np.zeros(ctx.out_shape))
    if len(parts) == 1:
        return ops.identity(parts[0])
    return ops.concat(parts, _dim(dim, rank))


def _with(shape: Any, axis: int, n: int) -> tuple[int, ...]:
    return tuple(n if a == axis else int(s) for a, s in enumerate(shape))


def _split_at(ctx: NodeContext, x: popxl.Tensor, sizes: list[int], dim: int) -> list:
    d = _dim(dim, x.rank)
    out, start = [], 0
    for size in sizes:
        if size == 0:
            out.append(
                ctx.jax(
                    "empty_slice",
                    _empty_slice,
                    x,
                    begin=start,
                    axis=d,
                    outputs=[(_with(x.shape, d, 0), x.dtype)],
                )
            )
        else:
            out.append(ops.slice(x, [start], [start + size], [1], [d]))
        start += size
    return out


@lowering(aten.split_with_sizes.default)
def _lower_split_with_sizes(ctx: NodeContext, x: popxl.Tensor, sizes: Any, dim: int = 0) -> list:
    return _split_at(ctx, x, [int(s) for s in sizes], dim)


# Slicing -----------------------------------------------------------------------------------


def _bounds(n: int, start: int | None, end: int | None, step: int) -> tuple[int, int]:
    """torch's clamped ``[begin, stop)`` of a slice of an axis of ``n`` (``stop >= begin``)."""
    if step <= 0:
        raise ValueError(f"slice step must be positive, got {step}.")
    begin, stop, _ = slice(start, end, step).indices(n)
    return begin, max(stop, begin)


def _empty_slice(x: Any, begin: int, axis: int) -> Any:
    return jnp.take(x, jnp.zeros((0,), jnp.int32), axis=axis)


@lowering(aten.slice.Tensor)
def _lower_slice(
    ctx: NodeContext,
    x: popxl.Tensor,
    dim: int = 0,
    start: int | None = None,
    end: int | None = None,
    step: int = 1,
) -> popxl.Tensor:
    d = _dim(dim, x.rank)
    n = x.shape[d]
    begin, stop = _bounds(n, start, end, step)
    if (begin, stop, step) == (0, n, 1):
        return ops.identity(x)
    if stop == begin:
        return ctx.jax("empty_slice", _empty_slice, x, begin=begin, axis=d)
    return ops.slice(x, [begin], [stop], [step], [d])


@lowering(aten.narrow_copy.default)
def _lower_narrow_copy(
    ctx: NodeContext, x: popxl.Tensor, dim: int, start: int, length: int
) -> popxl.Tensor:
    d = _dim(dim, x.rank)
    begin = start % x.shape[d] if start < 0 else start
    return ops.slice(x, [begin], [begin + length], [1], [d])


@lowering(aten.select.int)
def _lower_select(ctx: NodeContext, x: popxl.Tensor, dim: int, index: int) -> popxl.Tensor:
    d = _dim(dim, x.rank)
    n = x.shape[d]
    if not -n <= index < n:
        raise IndexError(f"select(): index {index} out of range for dimension {dim} of size {n}.")
    i = index % n
    return ops.reshape(ops.slice(x, [i], [i + 1], [1], [d]), ctx.out_shape)


def _slice_scatter(x: Any, src: Any, axis: int, begin: int, stop: int, step: int) -> Any:
    index = [slice(None)] * x.ndim
    index[axis] = slice(begin, stop, step)
    return x.at[tuple(index)].set(src.astype(x.dtype))


@lowering(aten.slice_scatter.default)
def _lower_slice_scatter(
    ctx: NodeContext,
    x: popxl.Tensor,
    src: popxl.Tensor,
    dim: int = 0,
    start: int | None = None,
    end: int | None = None,
    step: int = 1,
) -> Any:
    """``x[..., start:end:step, ...] = src`` made functional (in-place writes to a slice)."""
    d = _dim(dim, x.rank)
    begin, stop = _bounds(x.shape[d], start, end, step)
    return ctx.jax(
        "slice_scatter", _slice_scatter, x, src, axis=d, begin=begin, stop=stop, step=int(step)
    )


# Reordering and repeating ------------------------------------------------------------------


def _flip(x: Any, axes: tuple[int, ...]) -> Any:
    return jnp.flip(x, axes)


@lowering(aten.flip.default)
def _lower_flip(ctx: NodeContext, x: popxl.Tensor, dims: Any) -> Any:
    axes = tuple(sorted(set(_dims(dims, x.rank))))
    if not axes or x.rank == 0:
        return ops.identity(x)
    return ctx.jax("flip", _flip, x, axes=axes)


def _tile(x: Any, reps: tuple[int, ...]) -> Any:
    return jnp.tile(x, reps)


@lowering(aten.repeat.default)
def _lower_repeat(ctx: NodeContext, x: popxl.Tensor, repeats: Any) -> Any:
    """``Tensor.repeat`` (numpy's ``tile``: leading repeats add dimensions)."""
    reps = tuple(int(r) for r in repeats)
    if len(reps) < x.rank:
        raise ValueError(
            "repeat: the number of repeat dims can not be smaller than the number of "
            f"dimensions of the tensor ({len(reps)} < {x.rank})."
        )
    return ctx.jax("repeat", _tile, x, reps=reps)


def _unfold(x: Any, axis: int, size: int, step: int) -> Any:
    count = (x.shape[axis] - size) // step + 1
    index = np.arange(count)[:, None] * step + np.arange(size)[None, :]
    windows = jnp.take(x, jnp.asarray(index, jnp.int32), axis=axis)
    return jnp.moveaxis(windows, axis + 1, -1)


@lowering(aten.unfold.default)
def _lower_unfold(ctx: NodeContext, x: popxl.Tensor, dim: int, size: int, step: int) -> Any:
    """``Tensor.unfold``: windows of ``size`` every ``step`` along ``dim``, the window as a
    new last dimension."""
    if x.rank == 0:
        return ops.reshape(x, ctx.out_shape)
    return ctx.jax("unfold", _unfold, x, axis=_dim(dim, x.rank), size=int(size), step=int(step))


# Checks torch.export inserts ---------------------------------------------------------------


@lowering(
    aten._assert_tensor_metadata.default,
    aten._assert_async.msg,
)
def _lower_assertion(ctx: NodeContext, *args: Any, **kwargs: Any) -> None:
    """Checks torch.export inserts about dtypes: they held while capturing, so they hold
    on the device too (``_assert_scalar`` and friends come only with data-dependent shapes,
    which a compiled program cannot have). ``_assert_async`` checks values
    (e.g. ``one_hot``'s class range); a compiled program cannot raise, as on the IPU, so it
    is dropped."""
    return None
