"""Elementwise ATen ops: arithmetic, math functions, comparisons, logic and bitwise ops.

Tables, as in ``popxl.ops.elementwise``: each entry maps an ATen op to the popxl op with
the same meaning, or to a JAX function recorded as ``aten::<name>``. Inputs are first cast
to the dtype torch computes in (its type promotion; the float output dtype for ops such as
``atan2`` that turn integers into floats), so popxl's equal-dtype rule holds.

Ops that ``run_decompositions`` rewrites (``clamp_min``, ``floor_divide``, ``rsub``,
``isfinite``, ``where.Scalar``...) have no record: the capture never shows them. The
activations live in ``activation.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import jax.scipy.special as jsp
from jax import lax
from torch.ops import aten

import popxl
from popxl import ops

from .registry import NodeContext, Promote, lowering
from .torch_derivatives import (
    atan2,
    clamp_ties_pass_through,
    copysign,
    entr,
    fmax,
    fmin,
    hypot,
    logit,
    maximum,
    minimum,
    power,
    sinc,
    xlog1py,
    xlogy,
)

# Unary ops ---------------------------------------------------------------------------------

# ATen op -> popxl op (float math on integer inputs computes in the float output dtype).
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


def _logical_not(x: Any) -> Any:
    return jnp.logical_not(x.astype(bool))


def _bitwise_not(x: Any) -> Any:
    return jnp.logical_not(x) if x.dtype == jnp.bool_ else jnp.invert(x)


def _reciprocal(x: Any) -> Any:
    return 1 / x


# ATen op -> (name, JAX function) for ops popxl does not have with torch's semantics.
_UNARY_JAX: dict[Any, tuple[str, Callable[[Any], Any]]] = {
    aten.rsqrt.default: ("rsqrt", lax.rsqrt),
    aten.reciprocal.default: ("reciprocal", _reciprocal),
    aten.erf.default: ("erf", lax.erf),
    aten.erfc.default: ("erfc", lax.erfc),
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
    aten.round.default: ("round", jnp.round),  # half to even, as torch
    aten.trunc.default: ("trunc", jnp.trunc),
    aten.sign.default: ("sign", jnp.sign),
    aten.signbit.default: ("signbit", jnp.signbit),
    aten.logical_not.default: ("logical_not", _logical_not),
    aten.bitwise_not.default: ("bitwise_not", _bitwise_not),
    aten.lgamma.default: ("lgamma", lax.lgamma),
    aten.digamma.default: ("digamma", lax.digamma),
    aten.i0.default: ("i0", jsp.i0),
    aten.special_i0e.default: ("special_i0e", jsp.i0e),
    aten.special_i1.default: ("special_i1", jsp.i1),
    aten.special_i1e.default: ("special_i1e", jsp.i1e),
    aten.special_ndtri.default: ("special_ndtri", jsp.ndtri),
    aten.special_erfcx.default: ("special_erfcx", jsp.erfcx),
}


def _unary_popxl(fn: Callable[[popxl.Tensor], popxl.Tensor]) -> Callable[..., popxl.Tensor]:
    def lower(ctx: NodeContext, x: popxl.Tensor) -> popxl.Tensor:
        return fn(x)

    return lower


def _unary_jax(name: str, fn: Callable[[Any], Any]) -> Callable[..., popxl.Tensor]:
    def lower(ctx: NodeContext, x: popxl.Tensor) -> popxl.Tensor:
        return ctx.jax(name, fn, x)

    return lower


# Float math on an integer input computes in the float output dtype (``sqrt`` of an int).
for _target, _fn in _UNARY_POPXL.items():
    lowering(_target, promote=Promote.INT_TO_FLOAT, operands=(0,))(_unary_popxl(_fn))
for _target, (_name, _jfn) in _UNARY_JAX.items():
    lowering(_target, promote=Promote.INT_TO_FLOAT, operands=(0,))(_unary_jax(_name, _jfn))


def _round_decimals(x: Any, decimals: int) -> Any:
    return jnp.round(x, decimals)


@lowering(aten.round.decimals)
def _lower_round_decimals(ctx: NodeContext, x: popxl.Tensor, *, decimals: int = 0) -> Any:
    return ctx.jax("round_decimals", _round_decimals, x, decimals=int(decimals))


def _polygamma(x: Any, n: int) -> Any:
    return jsp.polygamma(n, x)


@lowering(aten.polygamma.default, promote=Promote.INT_TO_FLOAT, operands=(1,))
def _lower_polygamma(ctx: NodeContext, n: int, x: popxl.Tensor) -> Any:
    return ctx.jax("polygamma", _polygamma, x, n=int(n))


# Binary ops ---------------------------------------------------------------------------------


# Binary records take both operands as tensors of torch's computation dtype: the promoted
# dtype, or the float output dtype of ops that make floats of integers (``atan2``).
def _binary(*targets: Any, overloads: tuple[str, ...] | None = None) -> Any:
    return lowering(*targets, promote=Promote.INT_TO_FLOAT, operands=(0, 1), overloads=overloads)


def _floordiv(x: Any, y: Any) -> Any:
    if jnp.issubdtype(x.dtype, jnp.integer):
        return jnp.floor_divide(x, y)
    return jnp.floor(x / y)


def _truncdiv(x: Any, y: Any) -> Any:
    if jnp.issubdtype(x.dtype, jnp.integer):
        return lax.div(x, y)
    return jnp.trunc(x / y)


def _bitwise(int_fn: Callable[..., Any], bool_fn: Callable[..., Any]) -> Callable[..., Any]:
    def fn(x: Any, y: Any) -> Any:
        return bool_fn(x, y) if x.dtype == jnp.bool_ else int_fn(x, y)

    return fn


def _ldexp(x: Any, e: Any) -> Any:
    return x * jnp.exp2(e)


# Overload packets: each record covers every one of the packet's tensor/scalar overloads it
# has (the ``overloads`` of its table).
_SCALAR_FORMS = ("Tensor", "Scalar", "Scalar_Tensor", "Tensor_Scalar")
_BINARY_JAX_PACKETS: dict[Any, tuple[str, Callable[[Any, Any], Any]]] = {
    aten.remainder: ("remainder", jnp.remainder),
    aten.fmod: ("fmod", jnp.fmod),
    aten.copysign: ("copysign", copysign),
    aten.bitwise_and: ("bitwise_and", _bitwise(jnp.bitwise_and, jnp.logical_and)),
    aten.bitwise_or: ("bitwise_or", _bitwise(jnp.bitwise_or, jnp.logical_or)),
    aten.bitwise_xor: ("bitwise_xor", _bitwise(jnp.bitwise_xor, jnp.logical_xor)),
    aten.bitwise_left_shift: ("left_shift", jnp.left_shift),
    aten.bitwise_right_shift: ("right_shift", jnp.right_shift),
    aten.__lshift__: ("left_shift", jnp.left_shift),
    aten.__rshift__: ("right_shift", jnp.right_shift),
}
_BINARY_POPXL: dict[Any, Callable[[popxl.Tensor, popxl.Tensor], popxl.Tensor]] = {
    aten.mul.Tensor: ops.mul,
    aten.mul.Scalar: ops.mul,
}
_BINARY_JAX: dict[Any, tuple[str, Callable[[Any, Any], Any]]] = {
    aten.pow.Tensor_Tensor: ("pow", power),
    aten.pow.Scalar: ("pow", power),
    aten.atan2.default: ("atan2", atan2),
    aten.maximum.default: ("maximum", maximum),
    aten.minimum.default: ("minimum", minimum),
    aten.fmax.default: ("fmax", fmax),
    aten.fmin.default: ("fmin", fmin),
    aten.hypot.default: ("hypot", hypot),
    aten.nextafter.default: ("nextafter", jnp.nextafter),
    aten.gcd.default: ("gcd", jnp.gcd),
    aten.lcm.default: ("lcm", jnp.lcm),
    aten.ldexp.Tensor: ("ldexp", _ldexp),
    aten.igamma.default: ("igamma", jsp.gammainc),
    aten.igammac.default: ("igammac", jsp.gammaincc),
}


def _binary_popxl(fn: Callable[..., popxl.Tensor]) -> Callable[..., popxl.Tensor]:
    def lower(ctx: NodeContext, a: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
        return ctx.tensor(fn(a, b))

    return lower


def _binary_jax(name: str, fn: Callable[[Any, Any], Any]) -> Callable[..., popxl.Tensor]:
    def lower(ctx: NodeContext, a: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
        return ctx.tensor(ctx.jax(name, fn, a, b, outputs=[(ctx.out_shape, a.dtype)]))

    return lower


for _target, _fn2 in _BINARY_POPXL.items():
    _binary(_target)(_binary_popxl(_fn2))
for _target, (_name, _jfn2) in _BINARY_JAX.items():
    _binary(_target)(_binary_jax(_name, _jfn2))
for _packet, (_name, _jfn2) in _BINARY_JAX_PACKETS.items():
    _binary(_packet, overloads=_SCALAR_FORMS)(_binary_jax(_name, _jfn2))
_binary(aten.special_zeta, overloads=("default", "self_scalar", "other_scalar"))(
    _binary_jax("special_zeta", jsp.zeta)
)


# Kept from decomposition: torch's own decompositions of these (a ``where`` around ``x * log
# y``, around ``sin(pi x) / (pi x)``) differentiate to 0 * inf = NaN where eager torch's
# derivative is 0.
_BINARY_JAX_KEPT: dict[Any, tuple[str, tuple[str, ...], Callable[[Any, Any], Any]]] = {
    aten.xlogy: ("xlogy", ("Tensor", "Scalar_Self", "Scalar_Other"), xlogy),
    aten.special_xlog1py: ("xlog1py", ("default", "self_scalar", "other_scalar"), xlog1py),
}
for _packet, (_name, _overloads, _jfn2) in _BINARY_JAX_KEPT.items():
    lowering(_packet, overloads=_overloads, preserve=True, promote=Promote.INT_TO_FLOAT)(
        _binary_jax(_name, _jfn2)
    )
_UNARY_JAX_KEPT: dict[Any, tuple[str, Callable[[Any], Any]]] = {
    aten.sinc.default: ("sinc", sinc),
    aten.special_entr.default: ("entr", entr),
}
for _target, (_name, _jfn) in _UNARY_JAX_KEPT.items():
    lowering(_target, preserve=True, promote=Promote.INT_TO_FLOAT, operands=(0,))(
        _unary_jax(_name, _jfn)
    )


@lowering(aten.logit.default, preserve=True, promote=Promote.INT_TO_FLOAT, operands=(0,))
def _lower_logit(ctx: NodeContext, x: popxl.Tensor, eps: float | None = None) -> Any:
    return ctx.jax("logit", logit, x, eps=None if eps is None else float(eps))


def _small_integer(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return float(value).is_integer() and abs(value) <= 64


def _integer_pow(x: Any, exponent: int) -> Any:
    return lax.integer_pow(x, exponent)


@lowering(aten.pow.Tensor_Scalar, promote=Promote.INT_TO_FLOAT, operands=(0,))
def _lower_pow_scalar(ctx: NodeContext, x: popxl.Tensor, exponent: Any) -> popxl.Tensor:
    """``x ** n`` for an integral ``n`` is repeated multiplication (exact for negative
    ``x``, as torch); other exponents use ``pow``."""
    if not _small_integer(exponent):
        return _binary_jax("pow", power)(ctx, x, ctx.tensor(exponent, x.dtype))
    n = int(exponent)
    if n < 0 and not x.dtype.is_floating_point:
        raise ValueError(
            f"aten.pow: integer tensors cannot be raised to the negative power {n} "
            f"(torch refuses it too), in {ctx.where()}."
        )
    return ctx.jax("integer_pow", _integer_pow, x, exponent=n)


def _scaled(ctx: NodeContext, t: popxl.Tensor, alpha: Any) -> popxl.Tensor:
    return t if alpha == 1 else ops.mul(t, ctx.constant(alpha, t.dtype))


@_binary(aten.add.Tensor, aten.add.Scalar)
def _lower_add(ctx: NodeContext, a: popxl.Tensor, b: popxl.Tensor, alpha: Any = 1) -> Any:
    if a.dtype == popxl.bool:  # torch: logical or
        return ctx.jax("logical_or", jnp.logical_or, a, b)
    return ctx.tensor(ops.add(a, _scaled(ctx, b, alpha)))


@_binary(aten.sub.Tensor, aten.sub.Scalar)
def _lower_sub(ctx: NodeContext, a: popxl.Tensor, b: popxl.Tensor, alpha: Any = 1) -> Any:
    return ctx.tensor(ops.sub(a, _scaled(ctx, b, alpha)))


# True division computes in its (float) output dtype.
@_binary(aten.div.Tensor, aten.div.Scalar)
def _lower_div(ctx: NodeContext, a: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
    return ops.div(a, b)


@_binary(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _lower_div_mode(
    ctx: NodeContext, a: popxl.Tensor, b: popxl.Tensor, rounding_mode: str | None = None
) -> Any:
    if rounding_mode is None:
        return _lower_div(ctx, a, b)
    if rounding_mode not in ("floor", "trunc"):
        raise ValueError(
            f"aten.div: rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}."
        )
    fn = _floordiv if rounding_mode == "floor" else _truncdiv
    return ctx.jax(f"div_{rounding_mode}", fn, a, b)


# Comparisons and logic ----------------------------------------------------------------------

# Packets, each for its Tensor and Scalar overloads; the operands compare in their promoted
# dtype.
_COMPARE: dict[Any, tuple[str, Callable[[Any, Any], Any]]] = {
    aten.eq: ("eq", jnp.equal),
    aten.ne: ("ne", jnp.not_equal),
    aten.lt: ("lt", jnp.less),
    aten.le: ("le", jnp.less_equal),
    aten.gt: ("gt", jnp.greater),
    aten.ge: ("ge", jnp.greater_equal),
}
_LOGICAL: dict[Any, tuple[str, Callable[[Any, Any], Any]]] = {
    aten.logical_and.default: ("logical_and", jnp.logical_and),
    aten.logical_or.default: ("logical_or", jnp.logical_or),
    aten.logical_xor.default: ("logical_xor", jnp.logical_xor),
}


def _compare(name: str, fn: Callable[[Any, Any], Any]) -> Callable[..., popxl.Tensor]:
    def lower(ctx: NodeContext, a: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
        return ctx.jax(name, fn, a, b)

    return lower


def _logical(name: str, fn: Callable[[Any, Any], Any]) -> Callable[..., popxl.Tensor]:
    def lower(ctx: NodeContext, x: Any, y: Any) -> popxl.Tensor:
        a, b = ctx.tensor(x, popxl.bool), ctx.tensor(y, popxl.bool)
        return ctx.jax(name, fn, a, b)

    return lower


for _packet, (_name, _cfn) in _COMPARE.items():
    lowering(_packet, overloads=("Tensor", "Scalar"), promote=Promote.DEFAULT)(
        _compare(_name, _cfn)
    )
for _target, (_name, _lfn) in _LOGICAL.items():
    lowering(_target)(_logical(_name, _lfn))


@lowering(aten.where.self)
def _lower_where(ctx: NodeContext, condition: Any, x: Any, y: Any) -> popxl.Tensor:
    dtype = ctx.out_dtype
    cond = ctx.tensor(condition, popxl.bool)
    return ops.where(cond, ctx.tensor(x, dtype), ctx.tensor(y, dtype))


# clamp's gradient at a value equal to a bound changed between torch releases: older ones pass
# it through to the input, newer ones give it to nothing for number bounds and split it between
# input and bound for tensor bounds (as min/max do). The records follow the installed torch
# (``clamp_ties_pass_through``).


def _clamp_min(x: Any, lo: Any) -> Any:
    return jnp.where(x < lo, lo, x)


def _clamp_max(x: Any, hi: Any) -> Any:
    return jnp.where(x > hi, hi, x)


def _clamp(x: Any, lo: Any, hi: Any) -> Any:
    return _clamp_max(_clamp_min(x, lo), hi)


def _clamp_min_strict(x: Any, lo: Any) -> Any:
    return jnp.where(x <= lo, lo, x)


def _clamp_max_strict(x: Any, hi: Any) -> Any:
    return jnp.where(x >= hi, hi, x)


def _clamp_strict(x: Any, lo: Any, hi: Any) -> Any:
    return _clamp_max_strict(_clamp_min_strict(x, lo), hi)


def _clamp_split(x: Any, lo: Any, hi: Any) -> Any:
    return jnp.minimum(jnp.maximum(x, lo), hi)


@lowering(aten.clamp.default, aten.clamp.Tensor)
def _lower_clamp(ctx: NodeContext, x: popxl.Tensor, min: Any = None, max: Any = None) -> Any:  # noqa: A002
    dtype = ctx.out_dtype
    x = ctx.tensor(x, dtype)
    if min is None and max is None:
        raise ValueError(f"aten.clamp needs min or max (both are None), in {ctx.where()}.")
    # (name, lowering) for a min bound, a max bound, and both
    kinds: tuple[tuple[str, Callable[..., Any]], ...]
    if clamp_ties_pass_through():
        kinds = ("clamp_min", _clamp_min), ("clamp_max", _clamp_max), ("clamp", _clamp)
    elif isinstance(min, popxl.Tensor) or isinstance(max, popxl.Tensor):
        kinds = (
            ("clamp_min_split", jnp.maximum),
            ("clamp_max_split", jnp.minimum),
            ("clamp_split", _clamp_split),
        )
    else:
        kinds = (
            ("clamp_min_strict", _clamp_min_strict),
            ("clamp_max_strict", _clamp_max_strict),
            ("clamp_strict", _clamp_strict),
        )
    if max is None:
        return ctx.jax(*kinds[0], x, ctx.tensor(min, dtype))
    if min is None:
        return ctx.jax(*kinds[1], x, ctx.tensor(max, dtype))
    return ctx.jax(*kinds[2], x, ctx.tensor(min, dtype), ctx.tensor(max, dtype))
