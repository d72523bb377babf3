"""Cases for ``poptorch/aten/shape.py``."""

from __future__ import annotations

import torch
from torch.ops import aten

from .harness import Case


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _ints(*shape: int) -> torch.Tensor:
    return torch.randint(-5, 5, shape, dtype=torch.int32)


def _copy_into(x, y):
    out = torch.zeros_like(y)
    out.copy_(x)
    return out * y


def _slice_assign(x, v):
    x = x * 1.0
    x[1:3] = v
    return x


def _slice_assign_step(x, v):
    x = x + 0.0
    x[:, 0:4:2] = v
    return x


def _split_sum(x):
    a, b, c = torch.split(x, [1, 3, 2], dim=1)
    return a * 2, b + 1, c


CASES = [
    Case("view", lambda x: x.view(2, -1, 3), lambda: (_randn(4, 3, 2),), [aten.view.default]),
    Case("flatten", torch.flatten, lambda: (_randn(3, 1, 2),), [aten.view.default]),
    Case(
        "unsqueeze",
        lambda x: x.unsqueeze(1).unsqueeze(-1),
        lambda: (_randn(3, 2),),
        [aten.unsqueeze.default],
    ),
    Case("squeeze_all", torch.squeeze, lambda: (_randn(1, 3, 1, 2),), [aten.squeeze.dims]),
    Case("squeeze_dim", lambda x: x.squeeze(-2), lambda: (_randn(3, 1, 2),), [aten.squeeze.dims]),
    Case(
        "permute", lambda x: x.permute(2, 0, -2), lambda: (_randn(2, 3, 4),), [aten.permute.default]
    ),
    Case(
        "transpose",
        lambda x: x.transpose(-1, 0),
        lambda: (_randn(2, 3, 4),),
        [aten.permute.default],
    ),
    Case("t", torch.t, lambda: (_randn(3, 5),), [aten.permute.default]),
    Case("numpy_T", lambda x: x.T, lambda: (_randn(2, 4),), [aten.permute.default]),
    Case(
        "expand", lambda x: x.expand(2, 3, -1, 4), lambda: (_randn(3, 1, 4),), [aten.expand.default]
    ),
    Case(
        "expand_scalar", lambda x: x.expand(2, 3), lambda: (torch.randn(()),), [aten.expand.default]
    ),
    Case(
        "expand_same", lambda x: x.expand(3, 4) * 2, lambda: (_randn(3, 4),), [aten.expand.default]
    ),
    Case(
        "diagonal",
        lambda x: torch.diagonal(x, 1, -1, 0),
        lambda: (_randn(4, 3, 5),),
        [aten.diagonal.default],
    ),
    Case(
        "as_strided",
        lambda x: x.as_strided((3, 2), (1, 3), 1),
        lambda: (_randn(2, 5),),
        [aten.as_strided.default],
    ),
    Case("clone", lambda x: x.clone() * 2, lambda: (_randn(3, 2),), [aten.clone.default]),
    Case("alias", lambda x: x[...] * 2, lambda: (_randn(3, 2),), [aten.alias.default]),
    Case(
        "copy_strided",  # torch's index_fill decomposition keeps a transposed input's strides
        lambda x: x.t().index_fill(1, torch.tensor([0, 2]), -1.0) * 2,
        lambda: (_randn(4, 3),),
        [torch.ops.prims.copy_strided.default],
    ),
    Case("detach", lambda x: x.detach() * x, lambda: (_randn(3, 2),), [aten.alias.default]),
    Case(
        "to_half",
        lambda x: x.half() * 2,
        lambda: (_randn(3, 2),),
        [aten._to_copy.default, aten._assert_tensor_metadata.default],
        half=False,
    ),
    Case(
        "to_int",
        lambda x: x.int(),
        lambda: (_randn(3, 2) * 4,),
        [aten._to_copy.default],
        grad=False,
    ),
    Case(
        "to_bool",
        lambda x: (x > 0).int(),
        lambda: (_randn(3, 2),),
        [aten._to_copy.default],
        grad=False,
    ),
    Case("copy_", _copy_into, lambda: (_randn(3), _randn(2, 3)), [aten.copy.default]),
    Case(
        "copy_cast",
        lambda x, y: y.copy_(x),
        lambda: (_randn(2, 3) * 4, _ints(2, 3)),
        [aten.copy.default],
        grad=False,
    ),
    Case(
        "cat",
        lambda a, b: torch.cat([a, b], -1),
        lambda: (_randn(2, 3), _randn(2, 1)),
        [aten.cat.default],
    ),
    Case(
        "cat_promote",
        lambda a, b: torch.cat([b, a], 0),
        lambda: (_randn(2, 3), _ints(1, 3)),
        [aten.cat.default],
    ),
    Case(
        "cat_empty",
        lambda a: torch.cat([a, torch.zeros(0)]),
        lambda: (_randn(2, 3),),
        [aten.cat.default],
    ),
    Case(
        "stack",
        lambda a, b: torch.stack([a, b], 1),
        lambda: (_randn(2, 3), _randn(2, 3)),
        [aten.cat.default],
    ),
    Case("split", _split_sum, lambda: (_randn(2, 6),), [aten.split_with_sizes.default]),
    Case(
        "chunk",
        lambda x: torch.chunk(x, 3, 0),
        lambda: (_randn(8, 2),),
        [aten.split_with_sizes.default],
    ),
    Case(
        "unbind",
        lambda x: torch.unbind(x, 1),
        lambda: (_randn(2, 3, 2),),
        [aten.slice.Tensor, aten.squeeze.dims],
    ),
    Case("slice", lambda x: x[1:-1, ::2], lambda: (_randn(4, 5),), [aten.slice.Tensor]),
    Case("slice_empty", lambda x: x[3:1] * 2, lambda: (_randn(4, 5),), [aten.slice.Tensor]),
    Case("narrow", lambda x: x.narrow(-1, 1, 2), lambda: (_randn(3, 4),), [aten.slice.Tensor]),
    Case(
        "narrow_copy",
        lambda x: x.narrow_copy(0, 1, 2),
        lambda: (_randn(3, 4),),
        [aten.narrow_copy.default],
    ),
    Case(
        "select", lambda x: x.select(-1, 1) + x[-1, 0], lambda: (_randn(3, 4),), [aten.select.int]
    ),
    Case(
        "slice_scatter",
        _slice_assign,
        lambda: (_randn(4, 3), _randn(2, 3)),
        [aten.slice_scatter.default],
    ),
    Case(
        "slice_scatter_step",
        _slice_assign_step,
        lambda: (_randn(2, 5), _randn(2, 2)),
        [aten.slice_scatter.default],
    ),
    Case("flip", lambda x: x.flip(0, -1), lambda: (_randn(2, 3, 4),), [aten.flip.default]),
    Case(
        "roll",
        lambda x: x.roll((1, -1), (0, 2)),
        lambda: (_randn(2, 3, 4),),
        [aten.index_select.default],
    ),
    Case("repeat", lambda x: x.repeat(2, 1, 3), lambda: (_randn(2, 3),), [aten.repeat.default]),
    Case("tile", lambda x: x.tile(2), lambda: (_randn(2, 3),), [aten.repeat.default]),
    Case(
        "tensor_unfold",
        lambda x: x.unfold(1, 3, 2),
        lambda: (_randn(2, 7, 3),),
        [aten.unfold.default],
    ),
    Case(
        "one_hot",
        lambda x: torch.nn.functional.one_hot(x, 5),
        lambda: (torch.tensor([0, 3, 4, 1]),),
        [aten._assert_async.msg],
        grad=False,
    ),
]
