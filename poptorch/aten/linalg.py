"""Cumulative ops (cummax/cummin, logcumsumexp) and distances (cdist, pdist, dist), as small JAX
functions recorded under their ATen names (``cumsum``/``cumprod`` are in ``index.py``).

``pairwise_distance`` and ``cosine_similarity`` reach the table decomposed into elementwise
ops and ``linalg_vector_norm`` (see ``reduce.py``).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax
from torch.ops import aten

import popxl

from .reduce import vector_norm
from .registry import NodeContext, lowering


def _axis(dim: int, rank: int) -> int:
    return dim % rank if rank else 0


# Cumulative ops -----------------------------------------------------------------------------


def _logcumsumexp(x: Any, *, axis: int) -> Any:
    if not x.ndim:
        return x
    wide = jnp.float32 if x.dtype == jnp.float16 else x.dtype
    return lax.cumlogsumexp(x.astype(wide), axis=axis).astype(x.dtype)


@lowering(aten.logcumsumexp.default)
def _lower_logcumsumexp(ctx: NodeContext, x: popxl.Tensor, dim: int) -> popxl.Tensor:
    x = ctx.tensor(x, ctx.out_dtype)
    return ctx.jax("logcumsumexp", _logcumsumexp, x, axis=_axis(dim, x.rank))


def _running_extreme(better: Any) -> Any:
    """Running max/min along ``axis`` with the index where it was last attained (a later
    equal value, or a NaN, takes over: torch's rule), by an associative scan; the values
    are gathered at those indices so the gradient goes to the chosen elements."""

    def combine(a: tuple, b: tuple) -> tuple:
        take_b = better(b[0], a[0]) | (b[0] == a[0]) | jnp.isnan(b[0])
        return jnp.where(take_b, b[0], a[0]), jnp.where(take_b, b[1], a[1])

    def fn(x: Any, *, axis: int) -> Any:
        if not x.ndim:
            return x, jnp.zeros((), jnp.int32)
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        steps = jnp.arange(x.shape[axis], dtype=jnp.int32).reshape(shape)
        positions = jnp.broadcast_to(steps, x.shape)
        _, idx = lax.associative_scan(combine, (lax.stop_gradient(x), positions), axis=axis)
        return jnp.take_along_axis(x, idx, axis=axis), idx

    return fn


_CUMMAX = _running_extreme(jnp.greater)
_CUMMIN = _running_extreme(jnp.less)


@lowering(aten.cummax.default)
def _lower_cummax(ctx: NodeContext, x: popxl.Tensor, dim: int) -> Any:
    return ctx.jax("cummax", _CUMMAX, x, axis=_axis(dim, x.rank))


@lowering(aten.cummin.default)
def _lower_cummin(ctx: NodeContext, x: popxl.Tensor, dim: int) -> Any:
    return ctx.jax("cummin", _CUMMIN, x, axis=_axis(dim, x.rank))


# Distances ----------------------------------------------------------------------------------


def _cdist(x1: Any, x2: Any, *, p: float) -> Any:
    """p-norm distance between each row of ``x1`` (..., P, M) and of ``x2`` (..., R, M),
    with broadcast batch dimensions."""
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    return vector_norm(diff, p, (-1,), False)


@lowering(aten._cdist_forward.default)
def _lower_cdist(
    ctx: NodeContext, x1: popxl.Tensor, x2: popxl.Tensor, p: float, compute_mode: Any = None
) -> popxl.Tensor:
    dtype = ctx.out_dtype
    return ctx.jax("cdist", _cdist, ctx.tensor(x1, dtype), ctx.tensor(x2, dtype), p=float(p))


def _pdist(x: Any, *, p: float) -> Any:
    """p-norm distance between each pair of rows ``i < j`` of ``x`` (N, M), in the order
    of ``(0, 1), (0, 2), ..., (N - 2, N - 1)``."""
    first, second = np.triu_indices(x.shape[0], 1)
    return vector_norm(x[first] - x[second], p, (-1,), False)


@lowering(aten._pdist_forward.default)
def _lower_pdist(ctx: NodeContext, x: popxl.Tensor, p: float = 2.0) -> popxl.Tensor:
    return ctx.jax("pdist", _pdist, ctx.tensor(x, ctx.out_dtype), p=float(p))


def _dist(x: Any, y: Any, *, p: float) -> Any:
    diff = x - y
    return vector_norm(diff.reshape(-1), p, (0,), False)


@lowering(aten.dist.default)
def _lower_dist(ctx: NodeContext, x: popxl.Tensor, y: popxl.Tensor, p: Any = 2) -> popxl.Tensor:
    dtype = ctx.out_dtype
    return ctx.jax("dist", _dist, ctx.tensor(x, dtype), ctx.tensor(y, dtype), p=float(p))
