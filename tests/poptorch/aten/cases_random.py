"""Cases for ``poptorch/aten/random.py``.

Random streams differ from torch's, so each case reduces its samples to checks of their
distribution (shape, range, mean, spread) that hold for torch's samples and ours: the
compared outputs are booleans. ``test_random_records.py`` checks seeds and dropout.
"""

from __future__ import annotations

import torch
from torch.ops import aten

from .harness import Case

N = 20000


def _dummy() -> tuple:
    return (torch.zeros(1),)


def _close(value: torch.Tensor, target: float, tol: float) -> torch.Tensor:
    return (value.float() - target).abs() < tol


def _stats(t: torch.Tensor, mean: float, std: float, lo: float | None = None, hi: float | None = None) -> torch.Tensor:
    """[mean ok, std ok, min >= lo, max < hi] for the samples ``t``."""
    f = t.float()
    checks = [_close(f.mean(), mean, 0.05 * max(1.0, abs(std))), _close(f.std(), std, 0.05 * max(1.0, std))]
    if lo is not None:
        checks.append(f.min() >= lo)
    if hi is not None:
        checks.append(f.max() < hi)
    return torch.stack(checks)


def _case(name: str, fn, ops, **kw) -> Case:
    return Case(name, fn, kw.pop("inputs", _dummy), ops, grad=False, **kw)


def _randint_checks(t: torch.Tensor, low: int, high: int) -> tuple:
    n = high - low
    return _stats(t, (low + high - 1) / 2, ((n * n - 1) / 12) ** 0.5, low, high), t.dtype == torch.int64


def _multinomial_checks(x: torch.Tensor) -> torch.Tensor:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4]) + x[0]
    draws = torch.multinomial(probs, N, replacement=True)
    freq = torch.stack([(draws == i).float().mean() for i in range(4)])
    distinct = torch.multinomial(probs.expand(3, 4), 4)  # without replacement: a permutation
    return torch.stack([((freq - probs).abs() < 0.02).all(), (distinct.sort(1)[0] == torch.arange(4)).all()])


def _randperm_checks(x: torch.Tensor) -> torch.Tensor:
    perm = torch.randperm(50) + x.long()[0]
    return torch.stack([(perm.sort()[0] == torch.arange(50)).all(), (perm != torch.arange(50)).any()])


def _dropout_checks(x: torch.Tensor) -> torch.Tensor:
    """Each element dropped or scaled by 1 / (1 - p) (inference models keep them all)."""
    out = torch.nn.functional.dropout(x, 0.5, training=True)
    return ((out == 0) | ((out - 2 * x).abs() < 1e-3) | (out == x)).all()


CASES = [
    _case("rand", lambda x: _stats(torch.rand(N, dtype=x.dtype) + x[0], 0.5, 0.2887, 0.0, 1.0), [aten.rand.default]),
    _case("rand_like", lambda x: _stats(torch.rand_like(x.expand(N)), 0.5, 0.2887, 0.0, 1.0), [aten.rand_like.default]),
    _case("randn", lambda x: _stats(torch.randn(4, N // 4, dtype=x.dtype) + x[0], 0.0, 1.0), [aten.randn.default]),
    _case("randn_like", lambda x: _stats(torch.randn_like(x.expand(N)), 0.0, 1.0), [aten.randn_like.default]),
    _case("uniform_", lambda x: _stats(torch.empty(N, dtype=x.dtype).uniform_(-2.0, 4.0) + x[0], 1.0, 1.732, -2.0, 4.0), [aten.uniform.default]),
    _case("normal_", lambda x: _stats(torch.empty(N, dtype=x.dtype).normal_(3.0, 2.0) + x[0], 3.0, 2.0), [aten.normal_functional.default]),
    _case("normal_float_float", lambda x: _stats(torch.normal(-1.0, 0.5, (N,)) + x[0], -1.0, 0.5), [aten.normal.float_float]),
    _case("normal_tensor_mean", lambda x: _stats(torch.normal(x.expand(N) + 4.0, 3.0), 4.0, 3.0), [aten.normal.Tensor_float]),
    _case("normal_tensor_std", lambda x: _stats(torch.normal(3.0, x.expand(N) + 9.0), 3.0, 9.0), [aten.normal.float_Tensor]),
    _case("normal_tensors", lambda x: _stats(torch.normal(x.expand(N) + 1.0, x.expand(N) + 2.0), 1.0, 2.0), [aten.normal.Tensor_Tensor]),
    _case("randint", lambda x: _randint_checks(torch.randint(5, 100, (N,)) + x.long()[0], 5, 100), [aten.randint.low]),
    _case("randint_high", lambda x: _randint_checks(torch.randint(7, (N,)) + x.long()[0], 0, 7), [aten.randint.default]),
    _case("randint_half", lambda x: _stats(torch.randint(0, 10, (N,), dtype=torch.half), 4.5, 2.872, 0, 10), [aten.randint.low]),
    _case("randint_like", lambda x: _randint_checks(torch.randint_like(x.long().expand(N), 3), 0, 3), [aten.randint_like.default]),
    _case("randint_like_low", lambda x: _randint_checks(torch.randint_like(x.long().expand(N), -4, 4), -4, 4), [aten.randint_like.low_dtype]),
    _case("randperm", _randperm_checks, [aten.randperm.default]),
    _case("bernoulli_p", lambda x: _stats(torch.empty(N, dtype=x.dtype).bernoulli_(0.3) + x[0], 0.3, 0.458, 0, 1.5), [aten.bernoulli.p]),
    _case("bernoulli_tensor", lambda x: _stats(torch.bernoulli(x.expand(N) + 0.8), 0.8, 0.4, 0, 1.5), [aten.rand.default]),
    _case("exponential_", lambda x: _stats(torch.empty(N, dtype=x.dtype).exponential_(0.5) + x[0], 2.0, 2.0, 0.0), [aten.exponential.default]),
    _case("multinomial", _multinomial_checks, [aten.multinomial.default], half=False),
    _case("dropout_in_inference", _dropout_checks, [aten.native_dropout.default], inputs=lambda: (torch.randn(3, 4),)),
]
