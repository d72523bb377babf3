"""Cases for ``poptorch/aten/linalg.py``."""

from __future__ import annotations

import torch
from torch.ops import aten

from .harness import Case


def _randn(*shapes: tuple) -> tuple:
    return lambda: tuple(torch.randn(*s) for s in shapes)


def _rand(*shapes: tuple) -> tuple:
    return lambda: tuple(torch.rand(*s) for s in shapes)


def _ties() -> tuple:
    return (torch.randint(0, 4, (3, 7)).float(),)


def _with_nans() -> tuple:
    x = torch.randn(3, 6)
    x[0, 2] = x[1, 0] = x[1, 4] = float("nan")
    return (x,)


def _nan_as_zero(fn: object) -> object:
    """``fn``'s (values, indices) with NaN values as 0 (the harness compares without NaNs)."""

    def run(x: torch.Tensor) -> tuple:
        values, indices = fn(x)
        return torch.where(values.isnan(), 0.0, values), indices

    return run


def _ints() -> tuple:
    return (torch.randint(-3, 4, (3, 5), dtype=torch.int32),)


def _cdist(p: float, **kw) -> object:
    return lambda a, b: torch.cdist(a, b, p, **kw)


# torch has no float16 cdist on the CPU to compare with.
_CDIST = [aten._cdist_forward.default]
_PDIST = [aten._pdist_forward.default]

CASES = [
    Case("cumsum_rows", lambda x: torch.cumsum(x, 1), _randn((3, 5)), [aten.cumsum.default]),
    Case("cumsum_neg_dim", lambda x: x.cumsum(-3), _randn((3, 2, 2)), [aten.cumsum.default]),
    Case("cumsum_int_cols", lambda x: torch.cumsum(x, 0), _ints, [aten.cumsum.default], grad=False),
    Case("cumsum_to_half", lambda x: torch.cumsum(x, 0, dtype=torch.float16).float(), _randn((4, 3)), [aten.cumsum.default], atol=1e-2, rtol=1e-2),
    Case("cumprod_rows", lambda x: torch.cumprod(x, 1), _randn((3, 5)), [aten.cumprod.default]),
    Case("cumprod_with_zeros", lambda x: torch.cumprod(x * (x.abs() > 0.3), 0), _randn((5, 3)), [aten.cumprod.default]),
    Case("logcumsumexp", lambda x: torch.logcumsumexp(x * 10, 1), _randn((3, 5)), [aten.logcumsumexp.default], atol=1e-4),
    Case("cummax", lambda x: torch.cummax(x, 1), _randn((3, 5)), [aten.cummax.default]),
    Case("cummax_ties", lambda x: torch.cummax(x, 1), _ties, [aten.cummax.default]),
    Case("cummin_ties", lambda x: torch.cummin(x, -1), _ties, [aten.cummin.default]),
    Case("cummax_nan", _nan_as_zero(lambda x: torch.cummax(x, 1)), _with_nans, [aten.cummax.default], grad=False),
    Case("cummin_int", lambda x: torch.cummin(x, 0), _ints, [aten.cummin.default], grad=False),
    Case("cdist_2", _cdist(2.0), _rand((3, 2), (4, 2)), _CDIST, half=False),
    Case("cdist_3_batched", _cdist(3.0), _rand((2, 3, 4), (2, 5, 4)), _CDIST, half=False),
    Case("cdist_broadcast", _cdist(2.0), _rand((3, 5, 2, 7), (5, 4, 7)), _CDIST, half=False),
    Case("cdist_1", _cdist(1.0), _rand((3, 4), (2, 4)), _CDIST, half=False),
    Case("cdist_inf", _cdist(float("inf")), _rand((3, 4), (2, 4)), _CDIST, half=False),
    Case("cdist_0", _cdist(0.0), lambda: (torch.randint(0, 2, (3, 4)).float(), torch.randint(0, 2, (2, 4)).float()), _CDIST, grad=False, half=False),
    Case("cdist_same_rows", lambda a: torch.cdist(a, a), _rand((3, 4)), _CDIST, half=False),
    Case("pdist_2", lambda a: torch.pdist(a), _rand((5, 3)), _PDIST, half=False),
    Case("pdist_1", lambda a: torch.pdist(a, 1.0), _rand((4, 6)), _PDIST, half=False),
    Case("pdist_3", lambda a: torch.pdist(a, 3.0), _rand((4, 2)), _PDIST, half=False),
    Case("pdist_inf", lambda a: torch.pdist(a, float("inf")), _rand((4, 3)), _PDIST, half=False),
    Case("pdist_repeated_rows", lambda a: torch.pdist(torch.cat([a, a])), _rand((2, 3)), _PDIST, half=False),
    Case("pdist_one_row", lambda a: torch.pdist(a), _rand((1, 3)), _PDIST, half=False, grad=False),
    Case("dist", lambda a, b: torch.dist(a, b), _randn((3, 4), (4,)), [aten.dist.default]),
    Case("dist_3", lambda a, b: torch.dist(a, b, 3), _randn((3, 4), (3, 4)), [aten.dist.default]),
    Case("pairwise_distance", lambda a, b: torch.nn.functional.pairwise_distance(a, b, 3.0), _randn((5, 4), (5, 4)), [aten.linalg_vector_norm.default]),
    Case("cosine_similarity", lambda a, b: torch.nn.functional.cosine_similarity(a, b, 0), _randn((5, 4), (5, 4)), [aten.linalg_vector_norm.default]),
]
