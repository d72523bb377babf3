"""Tensor creation: full/zeros/ones (and their ``_like`` and ``new_*`` forms), empty,
arange, scalar_tensor, tril/triu indices.

After ``run_decompositions`` zeros, ones, new_* and *_like arrive as ``full``/``full_like``
and linspace, logspace and eye as arange arithmetic, so these few records cover them. Every
value here is known when the program is built: each record makes one constant of the
node's shape and (narrowed) dtype.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from torch.ops import aten

import popxl

from .registry import NodeContext, lowering


def _filled(ctx: NodeContext, value: Any) -> popxl.Tensor:
    """A constant of the node's shape and dtype holding ``value`` everywhere (cast as torch
    casts a Python scalar: floats truncate towards zero into integer tensors)."""
    dtype = ctx.out_dtype
    if isinstance(value, bool) or dtype == popxl.bool:
        value = bool(value)
    elif not dtype.is_floating_point and isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot fill an integer tensor with {value}.")
        value = int(value)
    return ctx.constant(np.full(ctx.out_shape, value, dtype.as_numpy()), dtype)


@lowering(aten.full.default)
def _lower_full(ctx: NodeContext, size: Any, fill_value: Any, **_: Any) -> popxl.Tensor:
    return _filled(ctx, fill_value)


@lowering(aten.full_like.default)
def _lower_full_like(ctx: NodeContext, x: Any, fill_value: Any, **_: Any) -> popxl.Tensor:
    return _filled(ctx, fill_value)


@lowering(aten.scalar_tensor.default)
def _lower_scalar_tensor(ctx: NodeContext, value: Any, **_: Any) -> popxl.Tensor:
    return _filled(ctx, value)


@lowering(aten.empty.memory_format, aten.empty_permuted.default, aten.empty_strided.default)
def _lower_empty(ctx: NodeContext, *args: Any, **_: Any) -> popxl.Tensor:
    """Uninitialised memory in torch; zeros here (a program's values are deterministic)."""
    return _filled(ctx, 0)


@lowering(aten.arange.start_step)
def _lower_arange(
    ctx: NodeContext, start: Any, end: Any = None, step: Any = 1, **_: Any
) -> popxl.Tensor:
    """``start + i * step`` for the ``i`` torch counted (the node's length), computed in
    double precision and cast, as torch does (``arange(end)`` and ``arange(start, end)``
    arrive in this form)."""
    (n,) = ctx.out_shape
    dtype = ctx.out_dtype
    values: np.ndarray
    if dtype.is_floating_point:
        values = float(start) + np.arange(n, dtype=np.float64) * float(step)
    else:
        values = int(start) + np.arange(n, dtype=np.int64) * int(step)
    return ctx.constant(values.astype(dtype.as_numpy()), dtype)


def _indices_constant(ctx: NodeContext, rows: np.ndarray, cols: np.ndarray) -> popxl.Tensor:
    return ctx.constant(np.stack([rows, cols]).astype(ctx.out_dtype.as_numpy()))


@lowering(aten.tril_indices.default)
def _lower_tril_indices(ctx: NodeContext, row: int, col: int, offset: int = 0, **_: Any) -> Any:
    """Coordinates of the lower triangle in row-major order (numpy's order is torch's)."""
    return _indices_constant(ctx, *np.tril_indices(row, offset, col))


@lowering(aten.triu_indices.default)
def _lower_triu_indices(ctx: NodeContext, row: int, col: int, offset: int = 0, **_: Any) -> Any:
    return _indices_constant(ctx, *np.triu_indices(row, offset, col))
