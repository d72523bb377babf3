"""Reductions: sums, means, extrema, arg-extrema, products, variances."""

from __future__ import annotations

from typing import Any

from torch.ops import aten

import popxl
from popxl import ops

from ._registry import NodeContext, lowering


def _axes(dims: Any, rank: int) -> list[int]:
    if dims is None or dims == []:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % rank for d in dims}) if rank else []


@lowering(aten.sum.dim_IntList, aten.sum.default)
def _lower_sum(
    ctx: NodeContext, x: popxl.Tensor, dim: Any = None, keepdim: bool = False, **kw: Any
) -> popxl.Tensor:
    x = ctx.tensor(x, ctx.out_dtype)
    if x.rank == 0:
        return ops.identity(x)
    return ops.sum(x, _axes(dim, x.rank), keepdims=keepdim)


@lowering(aten.mean.dim, aten.mean.default)
def _lower_mean(
    ctx: NodeContext, x: popxl.Tensor, dim: Any = None, keepdim: bool = False, **kw: Any
) -> popxl.Tensor:
    x = ctx.tensor(x, ctx.out_dtype)
    if x.rank == 0:
        return ops.identity(x)
    return ops.mean(x, _axes(dim, x.rank), keepdims=keepdim)
