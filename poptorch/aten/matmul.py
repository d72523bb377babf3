"""Matrix products as popxl ``MatMul``: ``matmul``, ``mm``, ``bmm`` and the scaled-add forms
``addmm``, ``addmv``, ``addbmm``.

Grouped products (transformers' ``grouped_mm_fallback``, which its mixture-of-experts layers
call while exported, in float32; ``torch._grouped_mm`` itself exports only in bfloat16): the
rows of the input, sorted by expert, each multiplied by their group's matrix, the groups'
ends given by ``offs``. JAX's ``ragged_dot`` is that product, its gradients included.

``torch.matmul`` is kept whole (popxl's ``MatMul`` has its NumPy shape rules: 1-D promotion
and batch broadcasting), so a model's matmul is one op in the program rather than torch's
expand/view/bmm chain. ``linear``, ``einsum``, ``baddbmm``, ``dot`` and ``outer`` reach the
table already decomposed into these ops and elementwise ones. float16 products accumulate
in float32 (popxl's default partials type).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from torch.ops import aten

import popxl
from popxl import ops
from popxl.ops._base import dot_precision

from .registry import NodeContext, Promote, lowering, lowering_by_name


@lowering(aten.mm.default, aten.bmm.default, promote=Promote.DEFAULT)
def _lower_mm(ctx: NodeContext, a: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
    return ops.matmul(a, b)


@lowering(aten.matmul.default, preserve=True, promote=Promote.DEFAULT)
def _lower_matmul(ctx: NodeContext, a: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
    """Kept whole: one ``MatMul`` with torch.matmul's shape rules."""
    return ops.matmul(a, b)


def _scaled_add(ctx: NodeContext, bias: Any, product: Any, beta: Any, alpha: Any) -> popxl.Tensor:
    """``beta * bias + alpha * product()`` in the output dtype, as torch computes it: with
    ``beta == 0`` the bias is not read (its NaNs do not propagate), with ``alpha == 0`` the
    product is not computed (nor the NaNs of its operands)."""
    dtype = ctx.out_dtype
    terms = []
    if alpha != 0:
        p = ctx.tensor(product(dtype), dtype)
        terms.append(p if alpha == 1 else p * ctx.constant(alpha, dtype))
    if beta != 0:
        b = ctx.tensor(bias, dtype)
        terms.append(b if beta == 1 else b * ctx.constant(beta, dtype))
    zeros = ctx.constant(np.zeros(ctx.out_shape), dtype)
    if not terms:
        return ops.identity(zeros)
    out = terms[0] if len(terms) == 1 else ops.add(terms[0], terms[1])
    if tuple(out.shape) != ctx.out_shape:  # the bias alone, broadcast to the product's shape
        out = ops.add(out, zeros)
    return out


@lowering(aten.addmm.default)
def _lower_addmm(
    ctx: NodeContext, bias: Any, a: popxl.Tensor, b: popxl.Tensor, beta: Any = 1, alpha: Any = 1
) -> popxl.Tensor:
    def product(dtype: popxl.dtype) -> popxl.Tensor:
        return ops.matmul(ctx.tensor(a, dtype), ctx.tensor(b, dtype))

    return _scaled_add(ctx, bias, product, beta, alpha)


@lowering(aten.addmv.default)
def _lower_addmv(
    ctx: NodeContext,
    bias: Any,
    mat: popxl.Tensor,
    vec: popxl.Tensor,
    beta: Any = 1,
    alpha: Any = 1,
) -> popxl.Tensor:
    def product(dtype: popxl.dtype) -> popxl.Tensor:
        return ops.matmul(ctx.tensor(mat, dtype), ctx.tensor(vec, dtype))

    return _scaled_add(ctx, bias, product, beta, alpha)


@lowering(aten.addbmm.default)
def _lower_addbmm(
    ctx: NodeContext,
    bias: Any,
    b1: popxl.Tensor,
    b2: popxl.Tensor,
    beta: Any = 1,
    alpha: Any = 1,
) -> popxl.Tensor:
    """``beta * bias + alpha * sum_i b1[i] @ b2[i]``."""

    def product(dtype: popxl.dtype) -> popxl.Tensor:
        return ops.sum(ops.matmul(ctx.tensor(b1, dtype), ctx.tensor(b2, dtype)), [0])

    return _scaled_add(ctx, bias, product, beta, alpha)


def _trilinear(a: Any, b: Any, c: Any, *, expand: tuple, sumdim: tuple) -> Any:
    import jax.numpy as jnp  # noqa: PLC0415

    def widen(x: Any, dims: tuple) -> Any:
        return jnp.expand_dims(x, dims) if dims else x

    product = widen(a, expand[0]) * widen(b, expand[1]) * widen(c, expand[2])
    return jnp.sum(product, axis=sumdim) if sumdim else product


@lowering(aten._trilinear.default)
def _lower_trilinear(
    ctx: NodeContext,
    i1: popxl.Tensor,
    i2: popxl.Tensor,
    i3: popxl.Tensor,
    expand1: Any,
    expand2: Any,
    expand3: Any,
    sumdim: Any,
    unroll_dim: int = 1,
) -> popxl.Tensor:
    """``nn.Bilinear``'s contraction: each input widened at its ``expand`` dims, the three
    multiplied (broadcasting) and summed over ``sumdim`` (``unroll_dim`` only chooses how
    torch loops on the CPU)."""
    dtype = ctx.out_dtype
    expand = tuple(tuple(sorted(int(d) for d in e)) for e in (expand1, expand2, expand3))
    return ctx.jax(
        "_trilinear",
        _trilinear,
        *(ctx.tensor(t, dtype) for t in (i1, i2, i3)),
        expand=expand,
        sumdim=tuple(sorted(int(d) for d in sumdim)),
    )


def _grouped_mm(x: Any, w: Any, ends: Any) -> Any:
    sizes = jnp.diff(ends.astype(jnp.int32), prepend=0)
    return jax.lax.ragged_dot(x, w, sizes, precision=dot_precision(x.dtype))


@lowering_by_name("transformers::grouped_mm_fallback")
def _lower_transformers_grouped_mm(
    ctx: NodeContext, x: popxl.Tensor, w: popxl.Tensor, offs: popxl.Tensor
) -> popxl.Tensor:
    """transformers' grouped product: rows ``offs[g-1]:offs[g]`` of ``x`` times ``w[g]``
    (rows past the last end are zeros)."""
    dtype = ctx.out_dtype
    return ctx.jax(
        "grouped_mm_fallback",
        _grouped_mm,
        ctx.tensor(x, dtype),
        ctx.tensor(w, dtype),
        offs,
        nondiff=(2,),
    )
