"""Reductions: sums, means, products, extrema, arg-extrema, variances, any/all, norms.

popxl's reductions (``ReduceSum``, ``ReduceMax``, ``ArgMax``, ...) are used where their
meaning is torch's; the input is first cast to the dtype torch reduces in (the node's output
dtype: ``sum(int)`` is an integer sum, ``sum(x, dtype=float16)`` a half one). Ops whose
meaning popxl lacks (``max.dim`` with its indices, ``var``, ``median.dim``, ``mode``,
``nansum``, vector norms) are small JAX functions recorded under their ATen names.

Indices are int32 (PopTorch ran int64 as int32). Where torch returns values together with
their indices, the values are gathered at the indices, so the gradient flows to the chosen
element only, as torch's does.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from torch.ops import aten

import popxl
from popxl import ops

from .registry import NodeContext, lowering
from .torch_derivatives import abs as abs_


def _axes(dims: Any, rank: int) -> list[int]:
    """Torch's ``dim`` argument (None, an int, or a list; empty means all) as sorted axes."""
    if dims is None or dims == []:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % rank for d in dims}) if rank else []


def _reduce(ctx: NodeContext, fn: Any, x: popxl.Tensor, dim: Any, keepdim: bool) -> popxl.Tensor:
    """``fn`` (a popxl reduction) over torch's ``dim``, in the output's dtype."""
    x = ctx.tensor(x, ctx.out_dtype)
    axes = _axes(dim, x.rank)
    if x.rank == 0 or not axes:
        return ops.identity(x)
    return fn(x, axes, keepdims=keepdim)


# Sums, means, products ------------------------------------------------------------------


@lowering(aten.sum.dim_IntList)
def _lower_sum(
    ctx: NodeContext, x: popxl.Tensor, dim: Any = None, keepdim: bool = False, **kw: Any
) -> popxl.Tensor:
    return _reduce(ctx, ops.sum, x, dim, keepdim)


@lowering(aten.mean.dim, aten.mean.default)
def _lower_mean(
    ctx: NodeContext, x: popxl.Tensor, dim: Any = None, keepdim: bool = False, **kw: Any
) -> popxl.Tensor:
    return _reduce(ctx, ops.mean, x, dim, keepdim)


@lowering(aten.prod.default, aten.prod.dim_int)
def _lower_prod(
    ctx: NodeContext, x: popxl.Tensor, dim: Any = None, keepdim: bool = False, **kw: Any
) -> popxl.Tensor:
    return _reduce(ctx, ops.prod, x, dim, keepdim)


def _nansum(x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    wide = jnp.float32 if x.dtype == jnp.float16 else x.dtype
    return jnp.nansum(x.astype(wide), axis=axis, keepdims=keepdims).astype(x.dtype)


@lowering(aten.nansum.default, preserve=True)
def _lower_nansum(
    ctx: NodeContext, x: popxl.Tensor, dim: Any = None, keepdim: bool = False, **kw: Any
) -> popxl.Tensor:
    """Kept whole: torch decomposes it into ``where(isnan(x), 0, x)`` and a sum."""
    x = ctx.tensor(x, ctx.out_dtype)
    return ctx.jax("nansum", _nansum, x, axis=tuple(_axes(dim, x.rank)), keepdims=bool(keepdim))


# Extrema ----------------------------------------------------------------------------------


@lowering(aten.amax.default, aten.max.default)
def _lower_amax(
    ctx: NodeContext, x: popxl.Tensor, dim: Any = None, keepdim: bool = False
) -> popxl.Tensor:
    return _reduce(ctx, ops.max, x, dim, keepdim)


@lowering(aten.amin.default, aten.min.default)
def _lower_amin(
    ctx: NodeContext, x: popxl.Tensor, dim: Any = None, keepdim: bool = False
) -> popxl.Tensor:
    return _reduce(ctx, ops.min, x, dim, keepdim)


def _pick(x: Any, idx: Any, axis: int, keepdims: bool) -> Any:
    """``x``'s elements at ``idx`` (indices along ``axis``, with the axis kept)."""
    values = jnp.take_along_axis(x, idx, axis=axis)
    return values if keepdims else jnp.squeeze(values, axis)


def _extreme_dim(find: Any) -> Any:
    def fn(x: Any, *, axis: int, keepdims: bool) -> Any:
        if x.ndim == 0:
            return x, jnp.zeros((), jnp.int32)
        idx = find(x, axis=axis, keepdims=True).astype(jnp.int32)
        return _pick(x, idx, axis, keepdims), idx if keepdims else jnp.squeeze(idx, axis)

    return fn


_MAX_DIM = _extreme_dim(jnp.argmax)
_MIN_DIM = _extreme_dim(jnp.argmin)


@lowering(aten.max.dim)
def _lower_max_dim(ctx: NodeContext, x: popxl.Tensor, dim: int, keepdim: bool = False) -> Any:
    axis = dim % x.rank if x.rank else 0
    return ctx.jax("max_dim", _MAX_DIM, x, axis=axis, keepdims=bool(keepdim))


@lowering(aten.min.dim)
def _lower_min_dim(ctx: NodeContext, x: popxl.Tensor, dim: int, keepdim: bool = False) -> Any:
    axis = dim % x.rank if x.rank else 0
    return ctx.jax("min_dim", _MIN_DIM, x, axis=axis, keepdims=bool(keepdim))


def _arg(fn: Any) -> Any:
    def lower(ctx: NodeContext, x: popxl.Tensor, dim: Any = None, keepdim: bool = False) -> Any:
        if x.rank == 0:
            return ctx.constant(0, popxl.int32)
        if dim is None:  # over the flattened tensor; keepdim keeps every axis with size 1
            flat = fn(ops.reshape(x, (-1,)), 0, False)
            return ops.reshape(flat, ctx.out_shape)
        return fn(x, dim % x.rank, bool(keepdim))

    return lower


lowering(aten.argmax.default)(_arg(ops.argmax))
lowering(aten.argmin.default)(_arg(ops.argmin))


# Order statistics --------------------------------------------------------------------------


def _median_all(x: Any) -> Any:
    """The lower median of all elements (torch's: no averaging; NaN if any is NaN)."""
    flat = jnp.sort(x.reshape(-1))
    out = flat[(flat.size - 1) // 2]
    return jnp.where(jnp.isnan(flat[-1]), flat[-1], out) if _is_float(x) else out


def _is_float(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


def _median_dim(x: Any, *, axis: int, keepdims: bool) -> Any:
    """Lower median along ``axis`` and its index (the first NaN's, where there is one).

    Among equal values the index is the one a stable sort puts in the middle; torch's CPU
    kernel (a selection, not a sort) may return another of them."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    order = jnp.argsort(x, axis=axis, stable=True).astype(jnp.int32)
    mid = jnp.take(order, jnp.array([(x.shape[axis] - 1) // 2]), axis=axis)
    if _is_float(x):
        nan = jnp.isnan(x)
        first_nan = jnp.argmax(nan, axis=axis, keepdims=True).astype(jnp.int32)
        mid = jnp.where(jnp.any(nan, axis=axis, keepdims=True), first_nan, mid)
    return _pick(x, mid, axis, keepdims), mid if keepdims else jnp.squeeze(mid, axis)


@lowering(aten.median.default)
def _lower_median(ctx: NodeContext, x: popxl.Tensor) -> Any:
    return ctx.jax("median", _median_all, x)


@lowering(aten.median.dim)
def _lower_median_dim(
    ctx: NodeContext, x: popxl.Tensor, dim: int = -1, keepdim: bool = False
) -> Any:
    axis = dim % x.rank if x.rank else 0
    return ctx.jax("median_dim", _median_dim, x, axis=axis, keepdims=bool(keepdim))


def _mode(x: Any, *, axis: int, keepdims: bool) -> Any:
    """The most frequent value along ``axis`` (the smallest among equally frequent ones) and
    the index of its last occurrence, as torch's CPU kernel."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    xm = jnp.moveaxis(x, axis, -1)
    counts = jnp.sum(xm[..., :, None] == xm[..., None, :], axis=-1)
    best = jnp.max(counts, axis=-1, keepdims=True)
    big = jnp.asarray(jnp.inf if _is_float(x) else jnp.iinfo(x.dtype).max, x.dtype)
    value = jnp.min(jnp.where(counts == best, xm, big), axis=-1, keepdims=True)
    n = xm.shape[-1]
    positions = jnp.arange(n, dtype=jnp.int32)
    idx = jnp.max(jnp.where(xm == value, positions, -1), axis=-1, keepdims=True)
    idx = jnp.moveaxis(idx, -1, axis)
    return _pick(x, idx, axis, keepdims), idx if keepdims else jnp.squeeze(idx, axis)


@lowering(aten.mode.default)
def _lower_mode(ctx: NodeContext, x: popxl.Tensor, dim: int = -1, keepdim: bool = False) -> Any:
    axis = dim % x.rank if x.rank else 0
    return ctx.jax("mode", _mode, x, axis=axis, keepdims=bool(keepdim))


# Variance --------------------------------------------------------------------------------


def _var(x: Any, *, axis: tuple[int, ...], ddof: float, keepdims: bool) -> Any:
    wide = jnp.float32 if x.dtype == jnp.float16 else x.dtype
    # ``correction`` is jnp.var's float-typed name for ``ddof`` (torch's is a float too).
    return jnp.var(x.astype(wide), axis=axis, correction=ddof, keepdims=keepdims).astype(x.dtype)


def _var_mean(x: Any, *, axis: tuple[int, ...], ddof: float, keepdims: bool) -> Any:
    wide = x.astype(jnp.float32 if x.dtype == jnp.float16 else x.dtype)
    var = jnp.var(wide, axis=axis, correction=ddof, keepdims=keepdims)
    return var.astype(x.dtype), jnp.mean(wide, axis=axis, keepdims=keepdims).astype(x.dtype)


def _var_attrs(x: popxl.Tensor, dim: Any, correction: Any, keepdim: bool) -> dict[str, Any]:
    ddof = 1.0 if correction is None else float(correction)
    return {"axis": tuple(_axes(dim, x.rank)), "ddof": ddof, "keepdims": bool(keepdim)}


def _std(x: Any, *, axis: tuple[int, ...], ddof: float, keepdims: bool) -> Any:
    """The square root of ``_var``, with torch's gradient where the deviation is 0: zero
    (torch's ``std_backward`` masks it), where ``sqrt``'s would make it NaN."""
    var = _var(x, axis=axis, ddof=ddof, keepdims=keepdims)
    positive = var > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, var, 1)), 0).astype(var.dtype)


def _deviation(name: str, fn: Any) -> Any:
    """The record of ``aten.<name>.correction``: ``fn`` of ``x`` over ``dim`` with torch's
    ``correction`` (1 when None) and ``keepdim``."""

    def lower(
        ctx: NodeContext,
        x: popxl.Tensor,
        dim: Any = None,
        *,
        correction: Any = None,
        keepdim: bool = False,
    ) -> Any:
        x = ctx.tensor(x, ctx.out_dtype)
        return ctx.jax(name, fn, x, **_var_attrs(x, dim, correction, keepdim))

    return lower


lowering(aten.var.correction)(_deviation("var", _var))
lowering(aten.var_mean.correction)(_deviation("var_mean", _var_mean))
# std is kept whole: its decomposition (``sqrt(var)``) has a NaN gradient where the
# deviation is 0.
lowering(aten.std.correction, preserve=True)(_deviation("std", _std))


# any (torch decomposes all(x) into not(any(not(x)))) --------------------------------------


def _any(x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
    return jnp.any(x != 0, axis=axis, keepdims=keepdims)


def _logic_reduce(name: str, fn: Any) -> Any:
    def lower(ctx: NodeContext, x: popxl.Tensor, dim: Any = None, keepdim: bool = False) -> Any:
        return ctx.jax(name, fn, x, axis=tuple(_axes(dim, x.rank)), keepdims=bool(keepdim))

    return lower


lowering(aten.any.default, aten.any.dim, aten.any.dims)(_logic_reduce("any", _any))


def _is_all_true(x: Any) -> Any:
    return jnp.all(x)


@lowering(aten._is_any_true.default)
def _lower_is_any_true(ctx: NodeContext, x: popxl.Tensor) -> popxl.Tensor:
    return ctx.jax("any", _any, x, axis=tuple(range(x.rank)), keepdims=False)


@lowering(aten._is_all_true.default)
def _lower_is_all_true(ctx: NodeContext, x: popxl.Tensor) -> popxl.Tensor:
    """What torch's argument checks (e.g. torch.distributions' validation) reduce with."""
    return ctx.jax("is_all_true", _is_all_true, x)


# logsumexp and vector norms -----------------------------------------------------------------


@lowering(aten.logsumexp.default, preserve=True)
def _lower_logsumexp(
    ctx: NodeContext, x: popxl.Tensor, dim: Any = None, keepdim: bool = False
) -> Any:
    """Kept whole (popxl's ``ReduceLogSumExp``, which subtracts the maximum first)."""
    return _reduce(ctx, ops.logsumexp, x, dim, keepdim)


def _safe_root(total: Any, p: float) -> Any:
    """``total ** (1/p)`` with a zero gradient where ``total`` is 0 (torch's norm backward)."""
    zero = total == 0
    safe = jnp.where(zero, jnp.ones_like(total), total)
    root = jnp.sqrt(safe) if p == 2 else safe ** (1.0 / p)
    return jnp.where(zero, jnp.zeros_like(total), root)


def vector_norm(x: Any, ord: float, axis: Any, keepdims: bool) -> Any:
    """torch.linalg.vector_norm's meaning, computed in float32 for half inputs."""
    wide = x.astype(jnp.float32 if x.dtype == jnp.float16 else x.dtype)
    a = abs_(wide)
    if ord == float("inf"):
        out = jnp.max(a, axis=axis, keepdims=keepdims)
    elif ord == float("-inf"):
        out = jnp.min(a, axis=axis, keepdims=keepdims)
    elif ord == 0:
        out = jnp.sum((a != 0).astype(a.dtype), axis=axis, keepdims=keepdims)
    elif ord == 1:
        out = jnp.sum(a, axis=axis, keepdims=keepdims)
    elif ord == 2:
        out = _safe_root(jnp.sum(wide * wide, axis=axis, keepdims=keepdims), 2)
    else:
        # |x|^p with derivative 0 where x is 0 (infinite for p < 1), as torch's norm backward
        nonzero = a != 0
        powered = jnp.where(nonzero, jnp.where(nonzero, a, 1) ** ord, 0)
        out = _safe_root(jnp.sum(powered, axis=axis, keepdims=keepdims), ord)
    return out.astype(x.dtype)


def _vector_norm(x: Any, *, ord: float, axis: tuple[int, ...], keepdims: bool) -> Any:
    return vector_norm(x, ord, axis, keepdims)


@lowering(aten.linalg_vector_norm.default, preserve=True)
def _lower_vector_norm(
    ctx: NodeContext,
    x: popxl.Tensor,
    ord: Any = 2,
    dim: Any = None,
    keepdim: bool = False,
    **kw: Any,
) -> Any:
    """Kept whole: torch >= 2.15 decomposes it into ``abs``/``pow``/``sum`` chains whose
    gradient is NaN at a zero vector (torch's own backward gives 0 there)."""
    x = ctx.tensor(x, ctx.out_dtype)
    axis = tuple(_axes(dim, x.rank))
    return ctx.jax(
        "vector_norm", _vector_norm, x, ord=float(ord), axis=axis, keepdims=bool(keepdim)
    )


def _histc(x: Any, *, bins: int, lowest: float, highest: float) -> Any:
    x = x.reshape(-1)
    low: Any = lowest
    high: Any = highest
    if lowest == highest:  # the data's own range, widened by one each way if it is one value
        low, high = jnp.min(x), jnp.max(x)
        same = low == high
        low, high = jnp.where(same, low - 1, low), jnp.where(same, high + 1, high)
    inside = (x >= low) & (x <= high)
    # torch's CPU kernel: the bin of (x - low) * bins / (high - low), the top edge in the last
    where = ((x - low) * bins / (high - low)).astype(jnp.int32)
    where = jnp.where(inside, jnp.minimum(where, bins - 1), bins)
    return jnp.zeros(bins, x.dtype).at[where].add(1, mode="drop")


@lowering(aten.histc.default)
def _lower_histc(
    ctx: NodeContext, x: popxl.Tensor, bins: int = 100, min: Any = 0, max: Any = 0
) -> popxl.Tensor:
    """``torch.histc``: counts of the elements in ``bins`` equal bins over ``[min, max]``
    (the data's range when both are 0), elements outside not counted; not differentiable,
    as in torch."""
    if bins <= 0:
        raise ValueError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension 0")
    if float(min) > float(max):
        raise ValueError("torch.histc: max must be larger than min")
    x = ctx.tensor(x, ctx.out_dtype)
    return ctx.jax(
        "histc", _histc, x, nondiff=(0,), bins=int(bins), lowest=float(min), highest=float(max)
    )
