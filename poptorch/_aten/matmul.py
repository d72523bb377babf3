"""Matrix products: ``mm``, ``bmm``, ``addmm`` and friends, as popxl ``MatMul``."""

from __future__ import annotations

from typing import Any

from torch.ops import aten

import popxl
from popxl import ops

from ._registry import NodeContext, lowering, promoted_dtype


def _matmul_operands(ctx: NodeContext, a: popxl.Tensor, b: popxl.Tensor) -> tuple:
    dtype = promoted_dtype(ctx.node, 0, 1)
    return ctx.tensor(a, dtype), ctx.tensor(b, dtype)


@lowering(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _lower_mm(ctx: NodeContext, a: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
    return ops.matmul(*_matmul_operands(ctx, a, b))


@lowering(aten.addmm.default)
def _lower_addmm(
    ctx: NodeContext, bias: Any, a: popxl.Tensor, b: popxl.Tensor, beta: Any = 1, alpha: Any = 1
) -> popxl.Tensor:
    dtype = ctx.out_dtype
    product = ops.matmul(ctx.tensor(a, dtype), ctx.tensor(b, dtype))
    if alpha != 1:
        product = product * ctx.constant(alpha, dtype)
    if beta == 0:
        return product
    bias = ctx.tensor(bias, dtype)
    if beta != 1:
        bias = bias * ctx.constant(beta, dtype)
    return ops.add(product, bias)
