"""Cases for ``poptorch/_aten/elementwise.py``."""

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
    _unary("isfinite", lambda x: torch.isfinite(x.log()), aten.isfinite.default, grad=False),
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
    Case("floor_divide", torch.floor_divide, lambda: (torch.arange(-6, 6, dtype=torch.int32), torch.full((12,), 4, dtype=torch.int32)), [aten.floor_divide.default], grad=False, half=False),
    Case("remainder", torch.remainder, lambda: (_randn(3, 4) * 4, _positive(3, 4)), [aten.remainder.Tensor], grad=False),
    Case("remainder_scalar", lambda a: torch.remainder(a, 1.5), lambda: (_randn(3, 4) * 4,), [aten.remainder.Scalar], grad=False),
    Case("fmod", torch.fmod, lambda: (_randn(3, 4) * 4, _positive(3, 4)), [aten.fmod.Tensor], grad=False),
    Case("fmod_scalar", lambda a: torch.fmod(a, 1.5), lambda: (_randn(3, 4) * 4,), [aten.fmod.Scalar], grad=False),
    Case("pow", torch.pow, lambda: (_positive(3, 4), _randn(3, 4)), [aten.pow.Tensor_Tensor]),
    Case("pow_scalar", lambda a: a**3, lambda: (_randn(3, 4),), [aten.pow.Tensor_Scalar]),
    Case("pow_scalar_base", lambda a: 2.0**a, lambda: (_randn(3, 4),), [aten.pow.Scalar]),
    Case("atan2", torch.atan2, lambda: (_randn(3, 4), _randn(3, 4)), [aten.atan2.default]),
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
    Case("clamp_min", lambda a: torch.clamp_min(a, 0.1), lambda: (_randn(3, 4),), [aten.clamp_min.default]),
    Case("clamp_min_tensor", lambda a, lo: torch.clamp_min(a, lo), lambda: (_randn(3, 4), _randn(3, 4)), [aten.clamp_min.Tensor]),
    Case("clamp_max", lambda a: torch.clamp_max(a, 0.1), lambda: (_randn(3, 4),), [aten.clamp_max.default]),
    Case("clamp_max_tensor", lambda a, hi: torch.clamp_max(a, hi), lambda: (_randn(3, 4), _randn(3, 4)), [aten.clamp_max.Tensor]),
    Case("gelu", torch.nn.functional.gelu, lambda: (_randn(3, 4),), [aten.gelu.default], atol=1e-4),
    Case("gelu_tanh", lambda a: torch.nn.functional.gelu(a, approximate="tanh"), lambda: (_randn(3, 4),), [aten.gelu.default], atol=1e-4),
    Case("leaky_relu", lambda a: torch.nn.functional.leaky_relu(a, 0.2), lambda: (_randn(3, 4),), [aten.leaky_relu.default]),
    Case("elu", torch.nn.functional.elu, lambda: (_randn(3, 4),), [aten.elu.default]),
    Case("selu", torch.selu, lambda: (_randn(3, 4),), [aten.elu.default]),
    Case("hardtanh", torch.nn.functional.hardtanh, lambda: (_randn(3, 4),), [aten.hardtanh.default]),
    Case("softplus", lambda a: torch.nn.functional.softplus(a, beta=2.0), lambda: (_randn(3, 4),), [aten.softplus.default]),
]
