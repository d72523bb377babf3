"""Elementwise ATen ops: arithmetic, math, comparisons, logic and activations.

Tables, as in ``popxl.ops.elementwise``: each entry maps an ATen op to the popxl op with
the same meaning, or to a JAX function recorded as ``aten::<name>``. Inputs are first cast
to the dtype torch computes in (its type promotion), so popxl's equal-dtype rule holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from torch.ops import aten

import popxl
from popxl import ops

from ._registry import NodeContext, lowering, promoted_dtype

# Unary ops ---------------------------------------------------------------------------------

# ATen op -> popxl op (float math keeps the input's float dtype; integer inputs of float
# ops are cast to the output dtype first).
_UNARY_POPXL: dict[Any, Callable[[popxl.Tensor], popxl.Tensor]] = {
    aten.abs.default: ops.abs,
    aten.neg.default: ops.negate,
    aten.exp.default: ops.exp,
    aten.log.default: ops.log,
    aten.log2.default: ops.log2,
    aten.sqrt.default: ops.sqrt,
    aten.sin.default: ops.sin,
    aten.cos.default: ops.cos,
    aten.tanh.default: ops.tanh,
    aten.sigmoid.default: ops.sigmoid,
    aten.relu.default: ops.relu,
    aten.ceil.default: ops.ceil,
    aten.floor.default: ops.floor,
    aten.isnan.default: ops.isnan,
    aten.isinf.default: ops.isinf,
}


def _round_half_even(x: Any) -> Any:
    return jnp.round(x)


def _sign(x: Any) -> Any:
    return jnp.sign(x)


def _logical_not(x: Any) -> Any:
    return jnp.logical_not(x.astype(bool))


def _bitwise_not(x: Any) -> Any:
    return jnp.logical_not(x) if x.dtype == jnp.bool_ else jnp.invert(x)


# ATen op -> (name, JAX function) for ops popxl does not have with torch's semantics.
_UNARY_JAX: dict[Any, tuple[str, Callable[[Any], Any]]] = {
    aten.rsqrt.default: ("rsqrt", lax.rsqrt),
    aten.reciprocal.default: ("reciprocal", lambda x: 1 / x),
    aten.erf.default: ("erf", lax.erf),
    aten.erfinv.default: ("erfinv", lax.erf_inv),
    aten.expm1.default: ("expm1", jnp.expm1),
    aten.log1p.default: ("log1p", jnp.log1p),
    aten.log10.default: ("log10", jnp.log10),
    aten.exp2.default: ("exp2", jnp.exp2),
    aten.tan.default: ("tan", jnp.tan),
    aten.asin.default: ("asin", jnp.arcsin),
    aten.acos.default: ("acos", jnp.arccos),
    aten.atan.default: ("atan", jnp.arctan),
    aten.sinh.default: ("sinh", jnp.sinh),
    aten.cosh.default: ("cosh", jnp.cosh),
    aten.asinh.default: ("asinh", jnp.arcsinh),
    aten.acosh.default: ("acosh", jnp.arccosh),
    aten.atanh.default: ("atanh", jnp.arctanh),
    aten.round.default: ("round", _round_half_even),
    aten.trunc.default: ("trunc", jnp.trunc),
    aten.sign.default: ("sign", _sign),
    aten.logical_not.default: ("logical_not", _logical_not),
    aten.bitwise_not.default: ("bitwise_not", _bitwise_not),
    aten.isfinite.default: ("isfinite", jnp.isfinite),
    aten.lgamma.default: ("lgamma", lax.lgamma),
    aten.digamma.default: ("digamma", lax.digamma),
}


def _unary_popxl(fn: Callable[[popxl.Tensor], popxl.Tensor]) -> Callable[..., popxl.Tensor]:
    def lower(ctx: NodeContext, x: popxl.Tensor) -> popxl.Tensor:
        out_dtype = ctx.out_dtype
        if out_dtype.is_floating_point and x.dtype != out_dtype:
            x = ops.cast(x, out_dtype)
        return fn(x)

    return lower


def _unary_jax(name: str, fn: Callable[[Any], Any]) -> Callable[..., popxl.Tensor]:
    def lower(ctx: NodeContext, x: popxl.Tensor) -> popxl.Tensor:
        out_dtype = ctx.out_dtype
        if out_dtype.is_floating_point and x.dtype != out_dtype:
            x = ops.cast(x, out_dtype)
        return ctx.jax(name, fn, x)

    return lower


for _target, _fn in _UNARY_POPXL.items():
    lowering(_target)(_unary_popxl(_fn))
for _target, (_name, _jfn) in _UNARY_JAX.items():
    lowering(_target)(_unary_jax(_name, _jfn))


# Binary ops ---------------------------------------------------------------------------------


def _operands(ctx: NodeContext, x: Any, y: Any) -> tuple[popxl.Tensor, popxl.Tensor]:
    """Both operands as tensors of torch's computation dtype."""
    dtype = promoted_dtype(ctx.node, 0, 1)
    return ctx.tensor(x, dtype), ctx.tensor(y, dtype)


def _floordiv(x: Any, y: Any) -> Any:
    if jnp.issubdtype(x.dtype, jnp.integer):
        return jnp.floor_divide(x, y)
    return jnp.floor(x / y)


def _truncdiv(x: Any, y: Any) -> Any:
    if jnp.issubdtype(x.dtype, jnp.integer):
        return lax.div(x, y)
    return jnp.trunc(x / y)


def _remainder(x: Any, y: Any) -> Any:
    return jnp.remainder(x, y)


def _fmod(x: Any, y: Any) -> Any:
    return jnp.fmod(x, y)


def _pow(x: Any, y: Any) -> Any:
    return jnp.power(x, y)


def _atan2(x: Any, y: Any) -> Any:
    return jnp.arctan2(x, y)


def _bitwise(np_fn: Callable[..., Any], logical: Callable[..., Any]) -> Callable[..., Any]:
    def fn(x: Any, y: Any) -> Any:
        return logical(x, y) if x.dtype == jnp.bool_ else np_fn(x, y)

    return fn


_BINARY_POPXL: dict[Any, Callable[[popxl.Tensor, popxl.Tensor], popxl.Tensor]] = {
    aten.mul.Tensor: ops.mul,
    aten.mul.Scalar: ops.mul,
    aten.maximum.default: ops.maximum,
}
_BINARY_JAX: dict[Any, tuple[str, Callable[[Any, Any], Any]]] = {
    aten.remainder.Tensor: ("remainder", _remainder),
    aten.remainder.Scalar: ("remainder", _remainder),
    aten.fmod.Tensor: ("fmod", _fmod),
    aten.fmod.Scalar: ("fmod", _fmod),
    aten.pow.Tensor_Tensor: ("pow", _pow),
    aten.pow.Tensor_Scalar: ("pow", _pow),
    aten.pow.Scalar: ("pow", _pow),
    aten.atan2.default: ("atan2", _atan2),
    aten.bitwise_and.Tensor: ("bitwise_and", _bitwise(jnp.bitwise_and, jnp.logical_and)),
    aten.bitwise_or.Tensor: ("bitwise_or", _bitwise(jnp.bitwise_or, jnp.logical_or)),
    aten.bitwise_xor.Tensor: ("bitwise_xor", _bitwise(jnp.bitwise_xor, jnp.logical_xor)),
    aten.bitwise_and.Scalar: ("bitwise_and", _bitwise(jnp.bitwise_and, jnp.logical_and)),
    aten.bitwise_or.Scalar: ("bitwise_or", _bitwise(jnp.bitwise_or, jnp.logical_or)),
    aten.bitwise_xor.Scalar: ("bitwise_xor", _bitwise(jnp.bitwise_xor, jnp.logical_xor)),
    aten.minimum.default: ("minimum", jnp.minimum),
    aten.fmax.default: ("fmax", jnp.fmax),
    aten.fmin.default: ("fmin", jnp.fmin),
}


def _binary_popxl(fn: Callable[..., popxl.Tensor]) -> Callable[..., popxl.Tensor]:
    def lower(ctx: NodeContext, x: Any, y: Any) -> popxl.Tensor:
        a, b = _operands(ctx, x, y)
        return ctx.tensor(fn(a, b))

    return lower


def _binary_jax(name: str, fn: Callable[[Any, Any], Any]) -> Callable[..., popxl.Tensor]:
    def lower(ctx: NodeContext, x: Any, y: Any) -> popxl.Tensor:
        a, b = _operands(ctx, x, y)
        return ctx.tensor(ctx.jax(name, fn, a, b, outputs=[(ctx.out_shape, a.dtype)]))

    return lower


for _target, _fn2 in _BINARY_POPXL.items():
    lowering(_target)(_binary_popxl(_fn2))
for _target, (_name, _jfn2) in _BINARY_JAX.items():
    lowering(_target)(_binary_jax(_name, _jfn2))


@lowering(aten.add.Tensor, aten.add.Scalar)
def _lower_add(ctx: NodeContext, x: Any, y: Any, alpha: Any = 1) -> popxl.Tensor:
    a, b = _operands(ctx, x, y)
    if alpha != 1:
        b = b * ctx.constant(alpha, b.dtype)
    return ctx.tensor(ops.add(a, b))


@lowering(aten.sub.Tensor, aten.sub.Scalar)
def _lower_sub(ctx: NodeContext, x: Any, y: Any, alpha: Any = 1) -> popxl.Tensor:
    a, b = _operands(ctx, x, y)
    if alpha != 1:
        b = b * ctx.constant(alpha, b.dtype)
    return ctx.tensor(ops.sub(a, b))


@lowering(aten.rsub.Scalar, aten.rsub.Tensor)
def _lower_rsub(ctx: NodeContext, x: Any, y: Any, alpha: Any = 1) -> popxl.Tensor:
    a, b = _operands(ctx, x, y)
    if alpha != 1:
        a = a * ctx.constant(alpha, a.dtype)
    return ctx.tensor(ops.sub(b, a))


@lowering(aten.div.Tensor, aten.div.Scalar)
def _lower_div(ctx: NodeContext, x: Any, y: Any) -> popxl.Tensor:
    dtype = ctx.out_dtype  # true division: always in the (float) output dtype
    return ops.div(ctx.tensor(x, dtype), ctx.tensor(y, dtype))


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _lower_div_mode(ctx: NodeContext, x: Any, y: Any, rounding_mode: str | None = None) -> Any:
    if rounding_mode is None:
        return _lower_div(ctx, x, y)
    a, b = _operands(ctx, x, y)
    fn = _floordiv if rounding_mode == "floor" else _truncdiv
    return ctx.jax(f"div_{rounding_mode}", fn, a, b)


@lowering(aten.floor_divide.default)
def _lower_floor_divide(ctx: NodeContext, x: Any, y: Any) -> Any:
    a, b = _operands(ctx, x, y)
    return ctx.jax("div_floor", _floordiv, a, b)


# Comparisons and logic ----------------------------------------------------------------------

_COMPARE: dict[Any, tuple[str, Callable[[Any, Any], Any]]] = {}
for _op, _jnp_fn in (
    ("eq", jnp.equal),
    ("ne", jnp.not_equal),
    ("lt", jnp.less),
    ("le", jnp.less_equal),
    ("gt", jnp.greater),
    ("ge", jnp.greater_equal),
):
    _COMPARE[getattr(aten, _op).Tensor] = (_op, _jnp_fn)
    _COMPARE[getattr(aten, _op).Scalar] = (_op, _jnp_fn)

_LOGICAL: dict[Any, tuple[str, Callable[[Any, Any], Any]]] = {
    aten.logical_and.default: ("logical_and", jnp.logical_and),
    aten.logical_or.default: ("logical_or", jnp.logical_or),
    aten.logical_xor.default: ("logical_xor", jnp.logical_xor),
}


def _compare(name: str, fn: Callable[[Any, Any], Any]) -> Callable[..., popxl.Tensor]:
    def lower(ctx: NodeContext, x: Any, y: Any) -> popxl.Tensor:
        a, b = _operands(ctx, x, y)
        return ctx.jax(name, fn, a, b)

    return lower


def _logical(name: str, fn: Callable[[Any, Any], Any]) -> Callable[..., popxl.Tensor]:
    def lower(ctx: NodeContext, x: Any, y: Any) -> popxl.Tensor:
        a, b = ctx.tensor(x, popxl.bool), ctx.tensor(y, popxl.bool)
        return ctx.jax(name, fn, a, b)

    return lower


for _target, (_name, _cfn) in _COMPARE.items():
    lowering(_target)(_compare(_name, _cfn))
for _target, (_name, _lfn) in _LOGICAL.items():
    lowering(_target)(_logical(_name, _lfn))


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _lower_where(ctx: NodeContext, condition: Any, x: Any, y: Any) -> popxl.Tensor:
    dtype = ctx.out_dtype
    cond = ctx.tensor(condition, popxl.bool)
    return ops.where(cond, ctx.tensor(x, dtype), ctx.tensor(y, dtype))


@lowering(aten.clamp.default, aten.clamp.Tensor)
def _lower_clamp(ctx: NodeContext, x: popxl.Tensor, min: Any = None, max: Any = None) -> Any:  # noqa: A002
    dtype = ctx.out_dtype
    x = ctx.tensor(x, dtype)
    if min is not None:
        x = ops.maximum(x, ctx.tensor(min, dtype))
    if max is not None:
        x = ops.negate(ops.maximum(ops.negate(x), ops.negate(ctx.tensor(max, dtype))))
    return x


@lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def _lower_clamp_min(ctx: NodeContext, x: popxl.Tensor, min: Any) -> Any:  # noqa: A002
    return _lower_clamp(ctx, x, min=min)


@lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def _lower_clamp_max(ctx: NodeContext, x: popxl.Tensor, max: Any) -> Any:  # noqa: A002
    return _lower_clamp(ctx, x, max=max)


# Activations --------------------------------------------------------------------------------


@lowering(aten.gelu.default)
def _lower_gelu(ctx: NodeContext, x: popxl.Tensor, approximate: str = "none") -> popxl.Tensor:
    return ops.gelu(x) if approximate == "tanh" else ops.geluerf(x)


def _leaky_relu(x: Any, negative_slope: float) -> Any:
    return jnp.where(x > 0, x, x * jnp.asarray(negative_slope, x.dtype))


@lowering(aten.leaky_relu.default)
def _lower_leaky_relu(ctx: NodeContext, x: popxl.Tensor, negative_slope: float = 0.01) -> Any:
    return ctx.jax("leaky_relu", _leaky_relu, x, negative_slope=float(negative_slope))


def _elu(x: Any, alpha: float, scale: float, input_scale: float) -> Any:
    neg = jnp.asarray(alpha * scale, x.dtype) * jnp.expm1(x * jnp.asarray(input_scale, x.dtype))
    return jnp.where(x > 0, x * jnp.asarray(scale, x.dtype), neg)


@lowering(aten.elu.default)
def _lower_elu(
    ctx: NodeContext, x: popxl.Tensor, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0
) -> Any:
    return ctx.jax(
        "elu", _elu, x, alpha=float(alpha), scale=float(scale), input_scale=float(input_scale)
    )


def _hardtanh(x: Any, min_val: float, max_val: float) -> Any:
    return jnp.clip(x, jnp.asarray(min_val, x.dtype), jnp.asarray(max_val, x.dtype))


@lowering(aten.hardtanh.default)
def _lower_hardtanh(ctx: NodeContext, x: popxl.Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Any:
    return ctx.jax("hardtanh", _hardtanh, x, min_val=float(min_val), max_val=float(max_val))


def _softplus(x: Any, beta: float, threshold: float) -> Any:
    b = jnp.asarray(beta, x.dtype)
    return jnp.where(x * b > threshold, x, jax.nn.softplus(x * b) / b)


@lowering(aten.softplus.default)
def _lower_softplus(ctx: NodeContext, x: popxl.Tensor, beta: float = 1.0, threshold: float = 20.0) -> Any:
    return ctx.jax("softplus", _softplus, x, beta=float(beta), threshold=float(threshold))
