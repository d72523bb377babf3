"""Activation ATen ops: the relu family, gelu, elu/celu/selu, softplus, mish, silu,
softmax and log_softmax, rrelu.

The others (hardsigmoid, hardswish, softsign, tanhshrink, hard/soft shrink, threshold,
logsigmoid, glu, prelu) reach the table already decomposed into elementwise ops.
``softplus``, ``mish``, ``celu`` and ``silu`` are kept whole (``preserve=True``): their
decompositions compute ``exp`` of large inputs in a branch ``where`` discards, which makes
the gradient NaN there (0 * inf), and a single op reads better in the program.

Branches that overflow (``expm1`` of a large positive input) are computed on the input
clipped to the branch's own range, so that their gradient is 0, not NaN, where unused.
Gradients at the kinks follow torch (``x > 0`` picks the positive branch).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from torch.ops import aten

import popxl
from popxl import ops
from popxl.ops.nn import softmax_grad

from .registry import NodeContext, lowering


def _scalar(x: Any, value: float) -> Any:
    return jnp.asarray(value, x.dtype)


@lowering(aten.gelu.default)
def _lower_gelu(ctx: NodeContext, x: popxl.Tensor, approximate: str = "none") -> popxl.Tensor:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"aten.gelu: approximate must be 'none' or 'tanh', got {approximate!r}.")
    return ops.gelu(x) if approximate == "tanh" else ops.geluerf(x)


@lowering(aten.silu.default, preserve=True)
def _lower_silu(ctx: NodeContext, x: popxl.Tensor) -> popxl.Tensor:
    return ops.swish(x)


def _leaky_relu(x: Any, negative_slope: float) -> Any:
    return jnp.where(x > 0, x, x * _scalar(x, negative_slope))


@lowering(aten.leaky_relu.default)
def _lower_leaky_relu(ctx: NodeContext, x: popxl.Tensor, negative_slope: float = 0.01) -> Any:
    return ctx.jax("leaky_relu", _leaky_relu, x, negative_slope=float(negative_slope))


def _elu(x: Any, alpha: float, scale: float, input_scale: float) -> Any:
    # where, not minimum: at 0 the derivative is the negative branch's, as torch's.
    negative = jnp.where(x > 0, _scalar(x, 0), x)
    neg = _scalar(x, alpha * scale) * jnp.expm1(negative * _scalar(x, input_scale))
    return jnp.where(x > 0, x * _scalar(x, scale), neg)


@lowering(aten.elu.default)
def _lower_elu(
    ctx: NodeContext,
    x: popxl.Tensor,
    alpha: float = 1.0,
    scale: float = 1.0,
    input_scale: float = 1.0,
) -> Any:
    attrs: dict[str, Any] = {
        "alpha": float(alpha),
        "scale": float(scale),
        "input_scale": float(input_scale),
    }
    return ctx.jax("elu", _elu, x, **attrs)


@lowering(aten.celu.default, preserve=True)
def _lower_celu(ctx: NodeContext, x: popxl.Tensor, alpha: float = 1.0) -> Any:
    """``elu`` with the input scaled by ``1 / alpha``."""
    if alpha == 0:
        raise ValueError(f"aten.celu: alpha must not be 0 (torch refuses it), in {ctx.where()}.")
    return ctx.jax("celu", _elu, x, alpha=float(alpha), scale=1.0, input_scale=1.0 / alpha)


def _hardtanh(x: Any, min_val: float, max_val: float) -> Any:
    """Gradient 1 strictly inside ``(min_val, max_val)``, 0 at and beyond the bounds."""
    lo, hi = _scalar(x, min_val), _scalar(x, max_val)
    y = jnp.where(x <= lo, lo, x)
    return jnp.where(y >= hi, hi, y)


@lowering(aten.hardtanh.default)
def _lower_hardtanh(
    ctx: NodeContext, x: popxl.Tensor, min_val: float = -1.0, max_val: float = 1.0
) -> Any:
    return ctx.jax("hardtanh", _hardtanh, x, min_val=float(min_val), max_val=float(max_val))


def _softplus(x: Any, beta: float, threshold: float) -> Any:
    b = _scalar(x, beta)
    return jnp.where(x * b > threshold, x, jax.nn.softplus(x * b) / b)


@lowering(aten.softplus.default, preserve=True)
def _lower_softplus(
    ctx: NodeContext, x: popxl.Tensor, beta: float = 1.0, threshold: float = 20.0
) -> Any:
    return ctx.jax("softplus", _softplus, x, beta=float(beta), threshold=float(threshold))


def _mish(x: Any) -> Any:
    return x * jnp.tanh(jax.nn.softplus(x))


@lowering(aten.mish.default, preserve=True)
def _lower_mish(ctx: NodeContext, x: popxl.Tensor) -> Any:
    return ctx.jax("mish", _mish, x)


# softmax ------------------------------------------------------------------------------------


@lowering(aten._softmax.default)
def _lower_softmax(ctx: NodeContext, x: popxl.Tensor, dim: int, half_to_float: bool) -> Any:
    x = ctx.tensor(x, ctx.out_dtype)  # half_to_float: computed in the float32 output
    return ops.softmax(x, dim) if x.rank else ops.identity(ctx.tensor(1.0))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _safe_softmax_rows(x: Any, axis: int) -> Any:
    # A row that is all -inf has a -inf maximum, so its exponentials are NaN and so is their
    # sum; every other row sums to at least 1. Zeroing the rows whose sum is not positive in
    # the final scaling keeps the maximum, the exponentials and the sum as plain softmax has
    # them, which XLA fuses with the scores' matmul (a select on the maximum breaks that).
    top = jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
    e = jnp.exp(x - top)
    total = jnp.sum(e, axis=axis, keepdims=True)
    return jnp.where(total > 0, e / total, 0)


@_safe_softmax_rows.defjvp
def _safe_softmax_jvp(axis: int, primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    # Softmax's derivative from its output alone, so masked rows (all zeros) get a zero
    # derivative instead of the NaN of the exponentials' path.
    (x,), (dx,) = primals, tangents
    y = _safe_softmax_rows(x, axis)
    return y, y * (dx - jnp.sum(y * dx, axis=axis, keepdims=True))


def _safe_softmax(x: Any, *, axis: int) -> Any:
    return _safe_softmax_rows(x, axis)


@lowering(aten._safe_softmax.default, preserve=True)
def _lower_safe_softmax(ctx: NodeContext, x: popxl.Tensor, dim: int, dtype: Any = None) -> Any:
    """Softmax with rows that are all ``-inf`` (fully masked attention) giving zeros, as one
    op (attention's decomposition otherwise spends four extra passes on the mask)."""
    x = ctx.tensor(x, ctx.out_dtype)
    if not x.rank:
        return ops.identity(ctx.tensor(1.0))
    return ctx.jax(
        "_safe_softmax", _safe_softmax, x, grad_from_output=softmax_grad, axis=dim % x.rank
    )


@lowering(aten._log_softmax.default)
def _lower_log_softmax(ctx: NodeContext, x: popxl.Tensor, dim: int, half_to_float: bool) -> Any:
    x = ctx.tensor(x, ctx.out_dtype)
    return ops.log_softmax(x, dim) if x.rank else ops.identity(ctx.tensor(0.0))


# rrelu ----------------------------------------------------------------------------------------


def _rrelu_sampled(x: Any, r: Any) -> tuple[Any, Any]:
    negative = x <= 0
    return jnp.where(negative, x * r, x), jnp.where(negative, r, jnp.ones_like(r))


@lowering(aten.rrelu_with_noise_functional.default)
def _lower_rrelu(
    ctx: NodeContext,
    x: popxl.Tensor,
    noise: popxl.Tensor,
    lower: float = 0.125,
    upper: float = 1.0 / 3.0,
    training: bool = False,
    generator: Any = None,
) -> tuple[popxl.Tensor, popxl.Tensor]:
    """Evaluation: leaky relu with the mean slope, ``noise`` passed on. Training: each
    non-positive element gets its own slope drawn from U(lower, upper), returned as the new
    noise (1 for positive elements)."""
    if not training:
        slope = (float(lower) + float(upper)) / 2
        out = ctx.jax("leaky_relu", _leaky_relu, x, negative_slope=slope, outputs=[ctx.out_spec(0)])
        return out, ops.identity(noise)
    r = ops.random_uniform(ctx.seed(), x.shape, float(lower), float(upper), x.dtype)
    return ctx.jax("rrelu_sampled", _rrelu_sampled, x, r, nondiff=(1,))
