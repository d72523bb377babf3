"""Cases for ``poptorch/aten/activation.py``, and for the activations that reach the table
decomposed into elementwise ops (their cases name the ops the capture really produces)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.ops import aten

from .harness import Case


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape) * 3


def _large() -> tuple:
    """Values where exp() overflows float32: the gradient must stay finite."""
    return (torch.tensor([[-100.0, -3.0, -0.5, 0.5, 3.0, 100.0, 1000.0]]),)


def _with_zeros() -> tuple:
    """Where the elu family's derivative is its negative branch's (torch's ``x <= 0``)."""
    x = _randn(3, 5)
    x[0] = 0.0
    return (x,)


def _act(name, fn, ops, make=lambda: (_randn(3, 5),), **kw):
    return Case(name, fn, make, ops, **kw)


def _rrelu_train(x: torch.Tensor) -> tuple:
    """Each non-positive element is scaled by a slope in [lower, upper]; the rest pass."""
    y = F.rrelu(x, 0.1, 0.3, training=True)
    negative = x <= 0
    slope = torch.where(negative, y / torch.where(negative, x, 1.0), 0.2)
    return torch.where(negative, 0.0, y - x), (slope >= 0.1) & (slope <= 0.3)

CASES = [
    _act("gelu", F.gelu, [aten.gelu.default], atol=1e-4),
    _act("gelu_tanh", lambda a: F.gelu(a, approximate="tanh"), [aten.gelu.default], atol=1e-4),
    _act("silu", F.silu, [aten.silu.default], atol=1e-4),
    _act("leaky_relu", lambda a: F.leaky_relu(a, 0.2), [aten.leaky_relu.default]),
    _act("elu", lambda a: F.elu(a, 0.7), [aten.elu.default]),
    _act("elu_large", F.elu, [aten.elu.default], make=_large, half=False),
    _act("selu", torch.selu, [aten.elu.default]),
    _act("celu", lambda a: F.celu(a, 0.5), [aten.celu.default]),
    _act("elu_zero", lambda a: F.elu(a, 0.7), [aten.elu.default], make=_with_zeros),
    _act("selu_zero", torch.selu, [aten.elu.default], make=_with_zeros),
    _act("celu_zero", lambda a: F.celu(a, 0.5), [aten.celu.default], make=_with_zeros),
    _act("celu_large", F.celu, [aten.celu.default], make=_large, half=False),
    _act("hardtanh", lambda a: F.hardtanh(a, -2.0, 1.5), [aten.hardtanh.default]),
    _act("relu6", F.relu6, [aten.hardtanh.default]),
    # a value on a bound gets no gradient, as in torch
    _act("hardtanh_tie", F.hardtanh, [aten.hardtanh.default], make=lambda: (torch.tensor([[-2.0, -1.0, 0.0, 1.0, 2.0]]),)),
    _act("softplus", lambda a: F.softplus(a, beta=2.0, threshold=5.0), [aten.softplus.default]),
    _act("softplus_large", F.softplus, [aten.softplus.default], make=_large, half=False),
    _act("mish", F.mish, [aten.mish.default], atol=1e-4),
    _act("mish_large", F.mish, [aten.mish.default], make=_large, half=False),
    _act("softmax", lambda a: F.softmax(a, dim=1), [aten._softmax.default]),
    _act("softmax_dim0", lambda a: F.softmax(a, dim=0), [aten._softmax.default]),
    # attention: scaled_dot_product_attention's math path uses _safe_softmax (a fully masked
    # row gives zeros, not NaN)
    _act("safe_softmax_attention", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), [aten._safe_softmax.default], make=lambda: (_randn(2, 3, 4, 8), _randn(2, 3, 5, 8), _randn(2, 3, 5, 8))),
    _act("safe_softmax_masked_row", lambda a: torch.ops.aten._safe_softmax(a.masked_fill(torch.arange(5) < 5 * (torch.arange(3)[:, None] == 1), float("-inf")), 1), [aten._safe_softmax.default]),
    _act("softmax_large", lambda a: F.softmax(a, dim=1), [aten._softmax.default], make=_large, half=False),
    _act("softmin", lambda a: F.softmin(a, dim=-1), [aten._softmax.default]),
    _act("softmax_to_float", lambda a: F.softmax(a.half(), dim=1, dtype=torch.float32), [aten._softmax.default], atol=1e-3, rtol=1e-2),
    _act("log_softmax", lambda a: F.log_softmax(a, dim=1), [aten._log_softmax.default]),
    _act("log_softmax_large", lambda a: F.log_softmax(a, dim=1), [aten._log_softmax.default], make=_large, half=False),
    # training: random slopes; checked through what does not depend on the draw
    _act("rrelu_train", _rrelu_train, [aten.rrelu_with_noise_functional.default], make=lambda: (_randn(6, 10),), grad=False, half=False),
    _act("rrelu_eval", lambda a: F.rrelu(a, 0.1, 0.3, training=False), [aten.rrelu_with_noise_functional.default]),
    # decomposed by the capture
    _act("hardsigmoid", F.hardsigmoid, [aten.clamp.default]),
    _act("hardswish", F.hardswish, [aten.clamp.default]),
    _act("softsign", F.softsign, [aten.abs.default]),
    _act("tanhshrink", F.tanhshrink, [aten.tanh.default]),
    _act("hardshrink", lambda a: F.hardshrink(a, 1.0), [aten.where.self]),
    _act("softshrink", lambda a: F.softshrink(a, 1.0), [aten.where.self]),
    _act("threshold", lambda a: F.threshold(a, 0.5, -2.0), [aten.where.self]),
    _act("logsigmoid", F.logsigmoid, [aten.log1p.default]),
    _act("logsigmoid_large", F.logsigmoid, [aten.log1p.default], make=_large, half=False),
    _act("glu", lambda a: F.glu(a, dim=0), [aten.sigmoid.default], make=lambda: (_randn(4, 3),)),
    _act("prelu", lambda a, w: F.prelu(a, w), [aten.where.self], make=lambda: (_randn(2, 3, 4), torch.rand(3))),
]

