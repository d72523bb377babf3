"""Cases for ``poptorch/aten/creation.py``."""

from __future__ import annotations

import torch
from torch.ops import aten

from .harness import Case


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _empty_plus(x):
    return torch.empty(2, 3).fill_(1.5) + x + torch.empty_like(x).fill_(2.0)


CASES = [
    Case(
        "full", lambda x: x + torch.full((2, 3), 1.25), lambda: (_randn(2, 3),), [aten.full.default]
    ),
    Case(
        "zeros_ones",
        lambda x: x * torch.ones(3) + torch.zeros(2, 3),
        lambda: (_randn(2, 3),),
        [aten.full.default],
    ),
    Case(
        "full_inf",
        lambda x: torch.maximum(x, torch.full((3,), float("-inf"))),
        lambda: (_randn(3),),
        [aten.full.default],
    ),
    Case(
        "full_bool",
        lambda x: torch.where(torch.ones(2, 3, dtype=torch.bool), x, 0.0),
        lambda: (_randn(2, 3),),
        [aten.full.default],
    ),
    Case(
        "full_int",
        lambda x: torch.full((2, 3), 7, dtype=torch.int32) + x.int(),
        lambda: (_randn(2, 3) * 3,),
        [aten.full.default],
        grad=False,
    ),
    Case(
        "new_full",
        lambda x: x.new_full((2, 3), 0.5) * x,
        lambda: (_randn(2, 3),),
        [aten.full.default],
    ),
    Case(
        "new_zeros",
        lambda x: x.new_zeros(3) + x.new_ones(3) + x,
        lambda: (_randn(2, 3),),
        [aten.full.default],
    ),
    Case(
        "full_like",
        lambda x: torch.full_like(x, 3.0) * x,
        lambda: (_randn(2, 3),),
        [aten.full_like.default],
    ),
    Case(
        "zeros_like_int",
        lambda x: torch.ones_like(x, dtype=torch.int32) + torch.zeros_like(x, dtype=torch.int32),
        lambda: (_randn(2, 3),),
        [aten.full_like.default],
        grad=False,
    ),
    Case(
        "scalar_tensor",
        lambda x: x.masked_fill(x > 0, 0.25),
        lambda: (_randn(2, 3),),
        [aten.scalar_tensor.default],
    ),
    Case(
        "empty",
        _empty_plus,
        lambda: (_randn(2, 3),),
        [aten.empty.memory_format, aten.empty_permuted.default],
    ),
    Case(
        "empty_strided",
        lambda x: torch.empty_strided((2, 3), (3, 1)).fill_(1.0) * x,
        lambda: (_randn(2, 3),),
        [aten.empty_strided.default],
    ),
    Case("arange", lambda x: x + torch.arange(5), lambda: (_randn(5),), [aten.arange.start_step]),
    Case(
        "arange_step",
        lambda x: x * torch.arange(10, 1, -2),
        lambda: (_randn(5),),
        [aten.arange.start_step],
    ),
    Case(
        "arange_float",
        lambda x: x + torch.arange(2, 10, 3.4),
        lambda: (_randn(3),),
        [aten.arange.start_step],
    ),
    Case(
        "arange_half_step",
        lambda x: x + torch.arange(2.5),
        lambda: (_randn(3),),
        [aten.arange.start_step],
    ),
    Case(
        "linspace",
        lambda x: x + torch.linspace(-1, 2, 5),
        lambda: (_randn(5),),
        [aten.arange.start_step],
        atol=1e-5,
    ),
    Case("eye", lambda x: x + torch.eye(3, 4), lambda: (_randn(3, 4),), [aten.arange.start_step]),
    Case(
        "tril_indices",
        lambda x: x + torch.tril_indices(4, 3, -1)[1],
        lambda: (_randn(6),),
        [aten.tril_indices.default],
    ),
    Case(
        "triu_indices",
        lambda x: x + torch.triu_indices(3, 4, 1)[0],
        lambda: (_randn(6),),
        [aten.triu_indices.default],
    ),
]
