"""Cases for ``poptorch/aten/elementwise.py``."""

from __future__ import annotations

import torch
from torch.ops import aten

from .harness import Case


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _positive(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) + 0.5


def _unit(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) * 1.8 - 0.9


def _ints(low: int, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(low, high, shape or (3, 4), dtype=torch.int32)


def _origin_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """Two 3x4 tensors whose first rows are both zero (signed zeros included), where
    ``atan2`` and ``hypot`` have torch's special derivatives (0 and NaN)."""
    a, b = _randn(3, 4), _randn(3, 4)
    a[0], b[0] = torch.tensor([0.0, -0.0, 0.0, -0.0]), torch.tensor([0.0, 0.0, -0.0, -0.0])
    return a, b


def _zero_row() -> torch.Tensor:
    """A 3x4 tensor whose first row is (signed) zeros."""
    a = _randn(3, 4)
    a[0] = torch.tensor([0.0, -0.0, 0.0, -0.0])
    return a


def _xlog1py_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` 0 in its first row where ``y`` is -1, 0, 2, 5."""
    y = torch.rand(3, 4) * 3
    y[0] = torch.tensor([-1.0, 0.0, 2.0, 5.0])
    return _zero_row(), y


def _fminmax_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Ties (both zero) in the first row, a NaN on each side in the second."""
    a, b = _zero_row(), _zero_row()
    a[1, 0], b[1, 1] = float("nan"), float("nan")
    return a, b


def _unary(name, fn, op, make=_randn, **kw):
    return Case(name, fn, lambda: (make(3, 4),), [op], **kw)


CASES = [
    _unary("abs", torch.abs, aten.abs.default, grad=False),
    _unary("neg", torch.neg, aten.neg.default),
    _unary("exp", torch.exp, aten.exp.default),
    _unary("log", torch.log, aten.log.default, make=_positive),
    _unary("log2", torch.log2, aten.log2.default, make=_positive),
    _unary("log10", torch.log10, aten.log10.default, make=_positive),
    _unary("log1p", torch.log1p, aten.log1p.default, make=_positive),
    _unary("expm1", torch.expm1, aten.expm1.default),
    _unary("exp2", torch.exp2, aten.exp2.default),
    _unary("sqrt", torch.sqrt, aten.sqrt.default, make=_positive),
    _unary("rsqrt", torch.rsqrt, aten.rsqrt.default, make=_positive),
    _unary("reciprocal", torch.reciprocal, aten.reciprocal.default, make=_positive),
    _unary("sin", torch.sin, aten.sin.default),
    _unary("cos", torch.cos, aten.cos.default),
    _unary("tan", torch.tan, aten.tan.default, make=_unit),
    _unary("asin", torch.asin, aten.asin.default, make=_unit),
    _unary("acos", torch.acos, aten.acos.default, make=_unit),
    _unary("atan", torch.atan, aten.atan.default),
    _unary("sinh", torch.sinh, aten.sinh.default),
    _unary("cosh", torch.cosh, aten.cosh.default),
    _unary("tanh", torch.tanh, aten.tanh.default),
    _unary("asinh", torch.asinh, aten.asinh.default),
    _unary("acosh", torch.acosh, aten.acosh.default, make=lambda *s: torch.rand(*s) + 1.5),
    _unary("atanh", torch.atanh, aten.atanh.default, make=_unit),
    _unary("sigmoid", torch.sigmoid, aten.sigmoid.default),
    _unary("relu", torch.relu, aten.relu.default),
    _unary("erf", torch.erf, aten.erf.default),
    _unary("erfinv", torch.erfinv, aten.erfinv.default, make=_unit, atol=1e-4),
    _unary("lgamma", torch.lgamma, aten.lgamma.default, make=_positive, half=False),
    _unary("digamma", torch.digamma, aten.digamma.default, make=_positive, half=False, atol=1e-4),
    _unary("ceil", torch.ceil, aten.ceil.default, grad=False),
    _unary("floor", torch.floor, aten.floor.default, grad=False),
    _unary("round", torch.round, aten.round.default, grad=False),
    _unary("trunc", torch.trunc, aten.trunc.default, grad=False),
    _unary("sign", torch.sign, aten.sign.default, grad=False),
    _unary("isnan", lambda x: torch.isnan(x.log()), aten.isnan.default, grad=False),
    _unary("isinf", lambda x: torch.isinf(1 / (x > 0).float()), aten.isinf.default, grad=False),
    # decomposed (abs, ne, eq, mul of bools)
    _unary("isfinite", lambda x: torch.isfinite(x.log()), aten.ne.Scalar, grad=False),
    _unary("logical_not", torch.logical_not, aten.logical_not.default, grad=False),
    Case(
        "bitwise_not",
        lambda x: torch.bitwise_not(x),
        lambda: (torch.randint(-5, 5, (3, 4), dtype=torch.int32),),
        [aten.bitwise_not.default],
        grad=False,
    ),
    Case("add", torch.add, lambda: (_randn(3, 4), _randn(4)), [aten.add.Tensor]),
    Case("add_alpha", lambda a, b: torch.add(a, b, alpha=2.5), lambda: (_randn(3, 4), _randn(3, 4)), [aten.add.Tensor]),
    Case("add_int_float", lambda a, b: a + b, lambda: (torch.arange(12, dtype=torch.int32).reshape(3, 4), _randn(3, 4)), [aten.add.Tensor], grad_inputs=[1]),
    Case("sub", lambda a, b: torch.sub(a, b, alpha=0.5), lambda: (_randn(3, 4), _randn(3, 1)), [aten.sub.Tensor]),
    Case("rsub", lambda a: 2.0 - a, lambda: (_randn(3, 4),), [aten.sub.Tensor]),
    Case("mul", torch.mul, lambda: (_randn(3, 4), _randn(3, 4)), [aten.mul.Tensor]),
    Case("div", torch.div, lambda: (_randn(3, 4), _positive(3, 4)), [aten.div.Tensor]),
    Case("div_int", lambda a, b: a / b, lambda: (torch.arange(1, 13, dtype=torch.int32), torch.full((12,), 4, dtype=torch.int32)), [aten.div.Tensor], grad=False, half=False),
    Case("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor"), lambda: (_randn(3, 4) * 5, _positive(3, 4)), [aten.div.Tensor_mode], grad=False),
    Case("div_trunc_int", lambda a, b: torch.div(a, b, rounding_mode="trunc"), lambda: (torch.arange(-6, 6, dtype=torch.int32), torch.full((12,), 4, dtype=torch.int32)), [aten.div.Tensor_mode], grad=False, half=False),
    Case("floor_divide", torch.floor_divide, lambda: (torch.arange(-6, 6, dtype=torch.int32), torch.full((12,), 4, dtype=torch.int32)), [aten.div.Tensor_mode], grad=False, half=False),
    Case("remainder", torch.remainder, lambda: (_randn(3, 4) * 4, _positive(3, 4)), [aten.remainder.Tensor], grad=False),
    Case("remainder_scalar", lambda a: torch.remainder(a, 1.5), lambda: (_randn(3, 4) * 4,), [aten.remainder.Scalar], grad=False),
    Case("fmod", torch.fmod, lambda: (_randn(3, 4) * 4, _positive(3, 4)), [aten.fmod.Tensor], grad=False),
    Case("fmod_scalar", lambda a: torch.fmod(a, 1.5), lambda: (_randn(3, 4) * 4,), [aten.fmod.Scalar], grad=False),
    Case("pow", torch.pow, lambda: (_positive(3, 4), _randn(3, 4)), [aten.pow.Tensor_Tensor]),
    Case("pow_scalar", lambda a: a**3, lambda: (_randn(3, 4),), [aten.pow.Tensor_Scalar]),
    Case("pow_scalar_base", lambda a: 2.0**a, lambda: (_randn(3, 4),), [aten.pow.Scalar]),
    Case("atan2", torch.atan2, lambda: (_randn(3, 4), _randn(3, 4)), [aten.atan2.default]),
    Case("atan2_origin", torch.atan2, _origin_rows, [aten.atan2.default]),
    Case("maximum", torch.maximum, lambda: (_randn(3, 4), _randn(3, 4)), [aten.maximum.default]),
    Case("minimum", torch.minimum, lambda: (_randn(3, 4), _randn(3, 4)), [aten.minimum.default]),
    Case("fmax", torch.fmax, lambda: (_randn(3, 4), _randn(3, 4)), [aten.fmax.default]),
    Case("fmin", torch.fmin, lambda: (_randn(3, 4), _randn(3, 4)), [aten.fmin.default]),
    *[
        Case(
            f"bitwise_{n}",
            getattr(torch, f"bitwise_{n}"),
            lambda: (torch.randint(0, 16, (3, 4), dtype=torch.int32), torch.randint(0, 16, (3, 4), dtype=torch.int32)),
            [getattr(aten, f"bitwise_{n}").Tensor],
            grad=False,
            half=False,
        )
        for n in ("and", "or", "xor")
    ],
    *[
        Case(
            f"bitwise_{n}_scalar",
            lambda a, n=n: getattr(torch, f"bitwise_{n}")(a, 5),
            lambda: (torch.randint(0, 16, (3, 4), dtype=torch.int32),),
            [getattr(aten, f"bitwise_{n}").Scalar],
            grad=False,
            half=False,
        )
        for n in ("and", "or", "xor")
    ],
    *[
        Case(f"{n}", getattr(torch, n), lambda: (_randn(3, 4), _randn(3, 4).round()), [getattr(aten, n).Tensor], grad=False)
        for n in ("eq", "ne", "lt", "le", "gt", "ge")
    ],
    *[
        Case(f"{n}_scalar", lambda a, n=n: getattr(torch, n)(a, 0.25), lambda: (_randn(3, 4),), [getattr(aten, n).Scalar], grad=False)
        for n in ("eq", "ne", "lt", "le", "gt", "ge")
    ],
    *[
        Case(f"logical_{n}", getattr(torch, f"logical_{n}"), lambda: (_randn(3, 4) > 0, _randn(3, 4) > 0), [getattr(aten, f"logical_{n}").default], grad=False)
        for n in ("and", "or", "xor")
    ],
    Case("where", lambda c, a, b: torch.where(c > 0, a, b), lambda: (_randn(3, 4), _randn(3, 4), _randn(4)), [aten.where.self], grad_inputs=[1, 2]),
    Case("where_scalar", lambda c, a: torch.where(c > 0, a, 0.5), lambda: (_randn(3, 4), _randn(3, 4)), [aten.where.self], grad_inputs=[1]),
    Case("clamp", lambda a: torch.clamp(a, -0.5, 0.5), lambda: (_randn(3, 4),), [aten.clamp.default]),
    Case("clamp_tensor", lambda a, lo, hi: torch.clamp(a, lo, hi), lambda: (_randn(3, 4), _randn(3, 4) - 1, _randn(3, 4) + 1), [aten.clamp.Tensor]),
    Case("clamp_min", lambda a: torch.clamp_min(a, 0.1), lambda: (_randn(3, 4),), [aten.clamp.default]),
    Case("clamp_min_tensor", lambda a, lo: torch.clamp_min(a, lo), lambda: (_randn(3, 4), _randn(3, 4)), [aten.clamp.Tensor]),
    Case("clamp_max", lambda a: torch.clamp_max(a, 0.1), lambda: (_randn(3, 4),), [aten.clamp.default]),
    Case("clamp_max_tensor", lambda a, hi: torch.clamp_max(a, hi), lambda: (_randn(3, 4), _randn(3, 4)), [aten.clamp.Tensor]),
    # value equal to a bound: torch passes the gradient through (min/max would halve it)
    Case("clamp_tie", lambda a: torch.clamp(a, 0.0, 1.0), lambda: (torch.tensor([[-1.0, 0.0, 0.5, 1.0, 2.0]]),), [aten.clamp.default]),
    Case("clamp_tensor_tie", lambda a, lo, hi: torch.clamp(a, lo, hi), lambda: (torch.tensor([[-1.0, 0.0, 0.5, 1.0, 2.0]]), torch.zeros(1, 5), torch.ones(1, 5)), [aten.clamp.Tensor]),
    Case("clamp_empty_range", lambda a: torch.clamp(a, 0.8, 0.2), lambda: (_randn(3, 4),), [aten.clamp.default]),
    Case("clamp_int_float_bounds", lambda a: torch.clamp(a, -4.5, 5.5), lambda: (_ints(-9, 9),), [aten.clamp.default], grad=False, half=False),
    Case("clamp_int", lambda a: torch.clamp(a, max=3), lambda: (_ints(-9, 9),), [aten.clamp.default], grad=False, half=False),
    _unary("erfc", torch.erfc, aten.erfc.default),
    _unary("signbit", lambda x: torch.signbit(x.round()), aten.signbit.default, grad=False),
    _unary("i0", torch.i0, aten.i0.default, half=False, atol=1e-4),
    _unary("i0e", torch.special.i0e, aten.special_i0e.default, half=False, atol=1e-4),
    _unary("i1", torch.special.i1, aten.special_i1.default, half=False, atol=1e-4),
    _unary("i1e", torch.special.i1e, aten.special_i1e.default, half=False, atol=1e-4),
    _unary("ndtri", torch.special.ndtri, aten.special_ndtri.default, make=lambda *s: torch.rand(*s) * 0.9 + 0.05, half=False, atol=1e-4),
    _unary("erfcx", torch.special.erfcx, aten.special_erfcx.default, half=False, atol=1e-4),
    _unary("round_decimals", lambda x: torch.round(x * 10, decimals=1), aten.round.decimals, grad=False, half=False),
    _unary("polygamma", lambda x: torch.polygamma(1, x), aten.polygamma.default, make=_positive, half=False, atol=1e-4),
    # integer inputs: float functions compute in float32, the others keep the dtype
    *[
        Case(f"{name}_int", fn, lambda: (_ints(-9, 9),), [op], grad=False, half=False)
        for name, fn, op in (
            ("abs", torch.abs, aten.abs.default),
            ("neg", torch.neg, aten.neg.default),
            ("sign", torch.sign, aten.sign.default),
            ("floor", torch.floor, aten.floor.default),
            ("ceil", torch.ceil, aten.ceil.default),
            ("round", torch.round, aten.round.default),
            ("trunc", torch.trunc, aten.trunc.default),
            ("relu", torch.relu, aten.relu.default),
            ("exp", torch.exp, aten.exp.default),
            ("sin", torch.sin, aten.sin.default),
            ("sqrt", lambda a: torch.sqrt(a.abs()), aten.sqrt.default),
            ("reciprocal", lambda a: torch.reciprocal(a.abs() + 1), aten.reciprocal.default),
            ("isnan", torch.isnan, aten.isnan.default),
            ("logical_not", torch.logical_not, aten.logical_not.default),
            ("atan2", lambda a: torch.atan2(a, a.abs() + 1), aten.atan2.default),
            ("pow", lambda a: a**2, aten.pow.Tensor_Scalar),
            ("pow_tensor", lambda a: torch.pow(a, a.abs() % 3), aten.pow.Tensor_Tensor),
            ("pow_scalar_base", lambda a: 2 ** a.abs(), aten.pow.Scalar),
            ("minimum", lambda a: torch.minimum(a, a.flip(0)), aten.minimum.default),
            ("maximum", lambda a: torch.maximum(a, a.flip(0)), aten.maximum.default),
            ("mul", lambda a: a * 3, aten.mul.Tensor),
            ("sub", lambda a: a - 3, aten.sub.Tensor),
            ("add_float", lambda a: a + 0.5, aten.add.Tensor),
            ("remainder", lambda a: torch.remainder(a, 4), aten.remainder.Scalar),
            ("fmod", lambda a: torch.fmod(a, 4), aten.fmod.Scalar),
            ("div_floor", lambda a: torch.div(a, 4, rounding_mode="floor"), aten.div.Tensor_mode),
        )
    ],
    Case("pow_odd", lambda a: a**3.0, lambda: (_randn(3, 4),), [aten.pow.Tensor_Scalar]),
    Case("pow_negative", lambda a: a**-2, lambda: (_positive(3, 4),), [aten.pow.Tensor_Scalar]),
    Case("pow_fraction", lambda a: a**2.5, lambda: (_positive(3, 4),), [aten.pow.Tensor_Scalar]),
    Case("add_bool", torch.add, lambda: (_randn(3, 4) > 0, _randn(3, 4) > 0), [aten.add.Tensor], grad=False),
    Case("mul_bool", torch.mul, lambda: (_randn(3, 4) > 0, _randn(3, 4) > 0), [aten.mul.Tensor], grad=False),
    Case("add_bool_int", lambda a, b: a + b, lambda: (_randn(3, 4) > 0, _ints(-9, 9)), [aten.add.Tensor], grad=False, half=False),
    Case("mul_bool_float", lambda a, b: a * b, lambda: (_randn(3, 4) > 0, _randn(3, 4)), [aten.mul.Tensor], grad_inputs=[1]),
    Case("add_0d_tensor", lambda a, b: a + b, lambda: (_randn(3, 4), torch.tensor(0.25, dtype=torch.float32)), [aten.add.Tensor], grad_inputs=[0]),
    # the .Scalar overloads, which export makes only when called directly
    Case("add_scalar_overload", lambda a: aten.add.Scalar(a, 1.5, alpha=2), lambda: (_randn(3, 4),), [aten.add.Scalar]),
    Case("sub_scalar_overload", lambda a: aten.sub.Scalar(a, 1.5), lambda: (_randn(3, 4),), [aten.sub.Scalar]),
    Case("mul_scalar_overload", lambda a: aten.mul.Scalar(a, 1.5), lambda: (_randn(3, 4),), [aten.mul.Scalar]),
    Case("div_scalar_overload", lambda a: aten.div.Scalar(a, 1.5), lambda: (_randn(3, 4),), [aten.div.Scalar]),
    Case("div_scalar_mode_overload", lambda a: aten.div.Scalar_mode(a, 1.5, rounding_mode="trunc"), lambda: (_randn(3, 4) * 4,), [aten.div.Scalar_mode], grad=False),
    Case("remainder_scalar_tensor", lambda a: torch.remainder(5.0, a), lambda: (_positive(3, 4),), [aten.remainder.Scalar_Tensor], grad=False),
    Case("modulo_mixed_sign", lambda a, b: (torch.remainder(a, b), torch.fmod(a, b)), lambda: (torch.tensor([-4.3, 7.2, 5.0, 4.3, -7.2, 8.0]), torch.tensor([2.1, -3.4, 8.0, -2.1, 3.4, 5.0])), [aten.remainder.Tensor, aten.fmod.Tensor], grad=False),
    Case("copysign", torch.copysign, lambda: (_randn(3, 4), _randn(3, 4)), [aten.copysign.Tensor], grad_inputs=[0]),
    Case("copysign_scalar", lambda a: torch.copysign(a, -1.0), lambda: (_randn(3, 4),), [aten.copysign.Scalar]),
    Case("hypot", torch.hypot, lambda: (_randn(3, 4), _randn(3, 4)), [aten.hypot.default]),
    Case("hypot_origin", torch.hypot, _origin_rows, [aten.hypot.default]),
    # Special points where torch's derivative is not JAX's (poptorch/aten/torch_derivatives.py).
    Case("abs_zero", torch.abs, lambda: (_zero_row(),), [aten.abs.default]),
    Case("pow_zero_base", torch.pow, lambda: (_zero_row().abs(), _zero_row().abs()), [aten.pow.Tensor_Tensor], half=False),
    Case("xlogy_zero", torch.xlogy, lambda: (_zero_row(), _zero_row().abs()), [aten.xlogy.Tensor], half=False),
    Case("xlogy_scalar_self", lambda b: torch.xlogy(2.0, b), lambda: (_positive(3, 4),), [aten.xlogy.Scalar_Self], half=False),
    Case("xlogy_scalar_other", lambda a: torch.xlogy(a, 3.0), lambda: (_zero_row(),), [aten.xlogy.Scalar_Other], half=False),
    Case("xlog1py_zero", torch.special.xlog1py, _xlog1py_inputs, [aten.special_xlog1py.default], half=False),
    Case("xlog1py_scalar_self", lambda b: torch.special.xlog1py(2.0, b), lambda: (_positive(3, 4),), [aten.special_xlog1py.self_scalar], half=False),
    Case("xlog1py_scalar_other", lambda a: torch.special.xlog1py(a, 3.0), lambda: (_zero_row(),), [aten.special_xlog1py.other_scalar], half=False),
    Case("entr_zero", torch.special.entr, lambda: (_zero_row().abs(),), [aten.special_entr.default], half=False),
    Case("sinc_zero", torch.sinc, lambda: (_zero_row(),), [aten.sinc.default]),
    Case("logit_ends", torch.logit, lambda: (torch.tensor([[0.0, 1.0, 0.3, 0.7]]),), [aten.logit.default], half=False),
    Case("logit_eps", lambda a: torch.logit(a, eps=0.2), lambda: (torch.tensor([[0.0, 0.1, 0.5, 0.9, 1.0]]),), [aten.logit.default], half=False),
    Case("copysign_zero", lambda a: torch.copysign(a, -1.0), lambda: (_zero_row(),), [aten.copysign.Scalar]),
    Case("fmax_ties_nan", torch.fmax, _fminmax_inputs, [aten.fmax.default]),
    Case("fmin_ties_nan", torch.fmin, _fminmax_inputs, [aten.fmin.default]),
    # NaN wins the value, and torch gives both sides the whole gradient there
    Case("maximum_ties_nan", torch.maximum, _fminmax_inputs, [aten.maximum.default]),
    Case("minimum_ties_nan", torch.minimum, _fminmax_inputs, [aten.minimum.default]),
    Case("nextafter", lambda a, b: torch.nextafter(a, b) - a, lambda: (_randn(3, 4), _randn(3, 4)), [aten.nextafter.default], grad=False, half=False, atol=0, rtol=0),
    Case("gcd", torch.gcd, lambda: (_ints(-20, 20), _ints(-20, 20)), [aten.gcd.default], grad=False, half=False),
    Case("lcm", torch.lcm, lambda: (_ints(-20, 20), _ints(-20, 20)), [aten.lcm.default], grad=False, half=False),
    # exponents >= 0: torch computes the gradient 2**e in integers (0 for e < 0)
    Case("ldexp", torch.ldexp, lambda: (_randn(3, 4), _ints(0, 4)), [aten.ldexp.Tensor], grad_inputs=[0]),
    Case("ldexp_negative", torch.ldexp, lambda: (_randn(3, 4), _ints(-4, 0)), [aten.ldexp.Tensor], grad=False),
    Case("igamma", torch.igamma, lambda: (_positive(3, 4), _positive(3, 4)), [aten.igamma.default], grad=False, half=False, atol=1e-4),
    Case("igammac", torch.igammac, lambda: (_positive(3, 4), _positive(3, 4)), [aten.igammac.default], grad=False, half=False, atol=1e-4),
    Case("zeta", torch.special.zeta, lambda: (_positive(3, 4) + 1, _positive(3, 4)), [aten.special_zeta.default], grad=False, half=False, atol=1e-4),
    Case("zeta_self_scalar", lambda a: torch.special.zeta(2.0, a), lambda: (_positive(3, 4),), [aten.special_zeta.self_scalar], grad=False, half=False, atol=1e-4),
    Case("zeta_other_scalar", lambda a: torch.special.zeta(a + 1, 2.0), lambda: (_positive(3, 4),), [aten.special_zeta.other_scalar], grad=False, half=False, atol=1e-4),
    *[
        Case(f"{op}_{overload}", fn, lambda: (_ints(0, 16), _ints(0, 4)), [getattr(getattr(aten, op), overload)], grad=False, half=False)
        for op, overload, fn in (
            ("bitwise_and", "Scalar_Tensor", lambda a, b: torch.bitwise_and(6, a)),
            ("bitwise_or", "Scalar_Tensor", lambda a, b: torch.bitwise_or(6, a)),
            ("bitwise_xor", "Scalar_Tensor", lambda a, b: torch.bitwise_xor(6, a)),
            ("__lshift__", "Scalar", lambda a, b: a << 2),
            ("__rshift__", "Scalar", lambda a, b: (a - 8) >> 1),
            ("__lshift__", "Tensor", lambda a, b: a << b),
            ("__rshift__", "Tensor", lambda a, b: (a - 8) >> b),
            ("bitwise_left_shift", "Tensor", torch.bitwise_left_shift),
            ("bitwise_left_shift", "Tensor_Scalar", lambda a, b: torch.bitwise_left_shift(a, 3)),
            ("bitwise_left_shift", "Scalar_Tensor", lambda a, b: torch.bitwise_left_shift(3, b)),
            ("bitwise_right_shift", "Tensor", lambda a, b: torch.bitwise_right_shift(a - 8, b)),
            ("bitwise_right_shift", "Tensor_Scalar", lambda a, b: torch.bitwise_right_shift(a - 8, 2)),
            ("bitwise_right_shift", "Scalar_Tensor", lambda a, b: torch.bitwise_right_shift(-100, b)),
        )
    ],
    *[
        Case(f"{n}_bool", fn, lambda: (_randn(3, 4) > 0, _randn(3, 4) > 0), [op], grad=False)
        for n, fn, op in (
            ("and", lambda a, b: a & b, aten.bitwise_and.Tensor),
            ("or", lambda a, b: a | b, aten.bitwise_or.Tensor),
            ("xor", lambda a, b: a ^ b, aten.bitwise_xor.Tensor),
            ("not", lambda a, b: ~a, aten.bitwise_not.default),
            ("eq", torch.eq, aten.eq.Tensor),
        )
    ],
    Case("compare_int_float", lambda a, b: (a < b, a == 2), lambda: (_ints(-3, 3), _randn(3, 4)), [aten.lt.Tensor, aten.eq.Scalar], grad=False, half=False),
    Case("where_int", lambda c, a: torch.where(c > 0, a, 3), lambda: (_randn(3, 4), _ints(-9, 9)), [aten.where.self], grad=False, half=False),
]
