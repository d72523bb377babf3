"""Shape and layout ATen ops: views, permutations, concatenation, slicing, copies."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from torch.ops import aten

import popxl
from popxl import ops

from ._registry import NodeContext, lowering, popxl_dtype


def _dim(d: int, rank: int) -> int:
    return d % rank if rank else 0


@lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _lower_view(ctx: NodeContext, x: popxl.Tensor, shape: Any) -> popxl.Tensor:
    return ops.reshape(x, ctx.out_shape)


@lowering(aten.permute.default)
def _lower_permute(ctx: NodeContext, x: popxl.Tensor, dims: Any) -> popxl.Tensor:
    return ops.transpose(x, [_dim(d, x.rank) for d in dims])


@lowering(aten.t.default)
def _lower_t(ctx: NodeContext, x: popxl.Tensor) -> popxl.Tensor:
    return ops.transpose(x, list(reversed(range(x.rank))))


@lowering(aten.unsqueeze.default, aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default)
def _lower_unsqueeze(ctx: NodeContext, x: popxl.Tensor, *dims: Any) -> popxl.Tensor:
    return ops.reshape(x, ctx.out_shape)


def _broadcast_to(x: Any, shape: tuple[int, ...]) -> Any:
    return jnp.broadcast_to(x, shape)


@lowering(aten.expand.default)
def _lower_expand(ctx: NodeContext, x: popxl.Tensor, size: Any, implicit: bool = False) -> Any:
    shape = ctx.out_shape
    if tuple(x.shape) == shape:
        return x
    return ctx.jax("expand", _broadcast_to, x, shape=shape)


@lowering(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default)
def _lower_clone(ctx: NodeContext, x: popxl.Tensor, **_: Any) -> popxl.Tensor:
    return ops.identity(x)


@lowering(aten._to_copy.default)
def _lower_to_copy(ctx: NodeContext, x: popxl.Tensor, **kwargs: Any) -> popxl.Tensor:
    dtype = ctx.out_dtype
    return ops.cast(x, dtype) if x.dtype != dtype else ops.identity(x)


@lowering(aten.cat.default)
def _lower_cat(ctx: NodeContext, tensors: list, dim: int = 0) -> popxl.Tensor:
    dtype = ctx.out_dtype
    parts = [ctx.tensor(t, dtype) for t in tensors if 0 not in t.shape or t.rank > 1]
    rank = len(ctx.out_shape)
    if len(parts) == 1:
        return ops.identity(parts[0])
    return ops.concat(parts, _dim(dim, rank))


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
    begin, stop, _ = slice(start, end, step).indices(n)
    if stop <= begin:
        stop = begin
    if (begin, stop, step) == (0, n, 1):
        return ops.identity(x)
    return ops.slice(x, [begin], [stop], [step], [d])


@lowering(aten.select.int)
def _lower_select(ctx: NodeContext, x: popxl.Tensor, dim: int, index: int) -> popxl.Tensor:
    d = _dim(dim, x.rank)
    i = index % x.shape[d]
    return ops.reshape(ops.slice(x, [i], [i + 1], [1], [d]), ctx.out_shape)


def _dtype_of(dtype: Any) -> popxl.dtype:
    return popxl_dtype(dtype)


@lowering(
    aten._assert_tensor_metadata.default,
    aten._assert_scalar.default,
    aten.sym_constrain_range_for_size.default,
)
def _lower_assertion(ctx: NodeContext, *args: Any, **kwargs: Any) -> None:
    """Checks torch.export inserts about shapes and dtypes: they held while capturing and
    shapes are fixed, so they hold on the device too."""
    return None
