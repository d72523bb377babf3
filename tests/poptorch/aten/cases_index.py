"""Cases for ``poptorch/aten/index.py``."""

from __future__ import annotations

import warnings

import torch
from torch.ops import aten

from poptorch.aten.index import grouped_scatter

from .harness import Case


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _idx(*values) -> torch.Tensor:
    return torch.tensor(values)


def _put(where):
    def fn(x, v, *idx):
        x = x * 1.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # uint8 masks are deprecated
            x[where(*idx)] = v
        return x

    return fn


def _scatter_inputs(shape=(3, 4), n=3):
    gen = torch.Generator().manual_seed(3)
    index = torch.randint(0, n, shape, generator=gen)
    return torch.randn(3, 4), index, torch.randn(shape)


def _unique_scatter_inputs():
    """Scatter along dim 1 with distinct indices per row (torch's gradient is then that of
    every write, whichever write wins)."""
    index = torch.stack(
        [torch.randperm(4, generator=torch.Generator().manual_seed(i))[:3] for i in range(2)]
    )
    return torch.randn(3, 4), index, torch.randn(2, 3)


def _legacy_scatter(reduce: str, dim: int = 1):
    """``Tensor.scatter(..., reduce=...)`` with a tensor source, without torch's deprecation
    warning (warnings are errors in this suite)."""

    def fn(x, i, s):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return x.scatter(dim, i, s, reduce=reduce)

    return fn


def _index_reduce(reduce: str, include_self: bool):
    def fn(x, i, s):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "index_reduce() is in beta"
            return x.index_reduce(1, i, s, reduce, include_self=include_self)

    return fn


def _mask(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(5)) > 0.5


def _ties() -> torch.Tensor:
    return torch.tensor([[1.0, 3.0, 1.0, 2.0], [0.5, 0.5, -1.0, 0.5]])


CASES = [
    Case(
        "index_first",
        lambda x, i: x[i],
        lambda: (_randn(4, 3), _idx([0, 2], [3, 0])),
        [aten.index.Tensor],
    ),
    Case(
        "index_middle",
        lambda x, i: x[:, i],
        lambda: (_randn(2, 4, 3), _idx(1, 3, 1)),
        [aten.index.Tensor],
    ),
    Case(
        "index_separated",
        lambda x, i, j: x[i, :, j],
        lambda: (_randn(3, 2, 4), _idx([0], [2]), _idx(1, 3)),
        [aten.index.Tensor],
    ),
    Case(
        "index_adjacent",
        lambda x, i, j: x[:, i, j],
        lambda: (_randn(2, 3, 4), _idx([0, 2]), _idx([1], [3])),
        [aten.index.Tensor],
    ),
    Case(
        "index_negative",
        lambda x, i: x[..., i],
        lambda: (_randn(2, 3), _idx(-1, 0)),
        [aten.index.Tensor],
    ),
    Case(
        "index_arange",
        lambda x: x[torch.arange(3), :2],
        lambda: (_randn(3, 4),),
        [aten.index.Tensor],
    ),
    Case(
        "index_put",
        _put(lambda i: i),
        lambda: (_randn(4, 3), _randn(2, 3), _idx(3, 1)),
        [aten.index_put.default],
    ),
    Case(
        "index_put_repeated",
        _put(lambda i: (i, i)),
        lambda: (_randn(3, 3, 2), _randn(2), _idx([0, 0], [2, 0])),
        [aten.index_put.default],
    ),
    Case(
        "index_put_broadcast",
        _put(lambda i: (slice(None), i)),
        lambda: (_randn(2, 4, 3), _randn(3), _idx(0, 2)),
        [aten.index_put.default],
    ),
    Case(
        "index_put_scalar",
        lambda x, i: x.index_put((i,), torch.tensor(2.5, dtype=x.dtype)),
        lambda: (_randn(4, 2), _idx(1, 3)),
        [aten.index_put.default],
    ),
    Case(
        "index_put_accumulate",
        lambda x, v, i: x.index_put((i,), v, accumulate=True),
        lambda: (_randn(4, 3), _randn(3, 3), _idx(1, 1, 2)),
        [aten.index_put.default],
    ),
    Case(
        "index_add",
        lambda x, v, i: x.index_add(1, i, v, alpha=2.0),
        lambda: (_randn(2, 4), _randn(2, 3), _idx(0, 3, 0)),
        [aten.index_put.default],
    ),
    Case(
        "index_fill",
        lambda x, i: x.index_fill(1, i, -1.0),
        lambda: (_randn(2, 4), _idx(0, 2)),
        [aten.index_put.default],
    ),
    Case(
        "masked_put_value",
        _put(lambda m: m),
        lambda: (_randn(3, 4), torch.tensor(0.5), _mask(3, 4)),
        [aten.index_put.default],
        grad_inputs=[0, 1],
    ),
    Case(
        "masked_put_rows",
        _put(lambda m: m),
        lambda: (_randn(3, 4), _randn(4), _mask(3)),
        [aten.index_put.default],
        grad_inputs=[0, 1],
    ),
    Case(
        "masked_put_uint8",
        _put(lambda m: m),
        lambda: (_randn(3, 4), _randn(4), _mask(3).to(torch.uint8)),
        [aten.index_put.default],
        grad=False,  # torch's backward warns about the uint8 mask (masked_put_rows checks it)
    ),
    Case(
        "masked_put_inner",
        _put(lambda m: (slice(None), m)),
        lambda: (_randn(2, 3, 2), _randn(2, 1), _mask(3, 2)),
        [aten.index_put.default],
        grad_inputs=[0, 1],
    ),
    Case(
        "masked_put_accumulate",
        lambda x, v, m: x.index_put((m,), v, accumulate=True),
        lambda: (_randn(3, 4), _randn(4), _mask(3)),
        [aten.index_put.default],
        grad_inputs=[0, 1],
    ),
    Case(
        "index_select",
        lambda x, i: x.index_select(-2, i),
        lambda: (_randn(2, 4, 3), _idx(3, 0, 0, 1, 2)),
        [aten.index_select.default],
    ),
    Case(
        "index_select_scalar_index",
        lambda x, i: x.index_select(0, i),
        lambda: (_randn(4, 3), torch.tensor(2)),
        [aten.index_select.default],
    ),
    Case(
        "gather",
        lambda x, i: torch.gather(x, 1, i),
        lambda: (_randn(3, 4), torch.tensor([[0, 3, 3, 1, 2], [2, 2, 0, 1, 1]])),
        [aten.gather.default],
    ),
    Case(
        "gather_negative_dim",
        lambda x, i: torch.gather(x, -3, i),
        lambda: (_randn(3, 2, 4), torch.tensor([[[2, 0, 1]], [[1, 1, 0]]])),
        [aten.gather.default],
    ),
    Case(
        "take_along_dim",
        lambda x: torch.take_along_dim(x, torch.argsort(x, dim=1), dim=1),
        lambda: (_randn(2, 3),),
        [aten.gather.default, aten.sort.default],
    ),
    Case(
        "scatter_src",
        lambda x, i, s: x.scatter(1, i, s),
        _unique_scatter_inputs,
        [aten.scatter.src],
    ),
    Case(
        "scatter_repeated",
        lambda x, i, s: x.scatter(0, i, s),
        lambda: (_randn(3, 2), torch.tensor([[1, 0], [1, 0], [2, 0]]), _randn(3, 2)),
        [aten.scatter.src],
        grad_inputs=[0],
    ),
    Case(
        "scatter_value",
        lambda x, i: x.scatter(1, i, 1.5),
        lambda: _scatter_inputs()[:2],
        [aten.scatter.value],
    ),
    Case(
        "scatter_add_legacy",
        _legacy_scatter("add"),
        _scatter_inputs,
        [aten.scatter.reduce],
        grad=False,  # torch has no gradient for scatter(reduce=...)
    ),
    Case(
        "scatter_multiply",
        _legacy_scatter("multiply", 0),
        lambda: _scatter_inputs((2, 4)),
        [aten.scatter.reduce],
        grad=False,  # torch has no gradient for scatter(reduce="multiply")
    ),
    Case(
        "scatter_value_add",
        lambda x, i: x.scatter(1, i, 1.1, reduce="add"),
        lambda: _scatter_inputs()[:2],
        [aten.scatter.value_reduce],
        grad=False,  # torch has no gradient for scatter(reduce=...)
    ),
    Case(
        "scatter_add",
        lambda x, i, s: x.scatter_add(0, i, s),
        lambda: _scatter_inputs((2, 3)),
        [aten.scatter_add.default],
    ),
    *[
        Case(
            f"scatter_reduce_{reduce}_{'self' if include_self else 'noself'}",
            lambda x, i, s, reduce=reduce, include_self=include_self: x.scatter_reduce(
                1, i, s, reduce, include_self=include_self
            ),
            _scatter_inputs,
            [aten.scatter_reduce.two],
            half=reduce != "prod",
        )
        for reduce in ("sum", "prod", "mean", "amax", "amin")
        for include_self in (True, False)
    ],
    Case(
        "scatter_reduce_int_mean",
        lambda x, i, s: x.scatter_reduce(0, i, s, "mean"),
        lambda: (
            torch.arange(8).reshape(2, 4),
            torch.tensor([[0, 1, 0, 0], [0, 1, 1, 0]]),
            torch.arange(8).reshape(2, 4) * 3,
        ),
        [aten.scatter_reduce.two],
        grad=False,
    ),
    *[
        Case(
            f"index_reduce_{reduce}_{'self' if include_self else 'noself'}",
            _index_reduce(reduce, include_self),
            lambda: (_randn(2, 4, 3), _idx(3, 0, 3), _randn(2, 3, 3)),
            [aten.index_reduce.default],
            half=reduce != "prod",
        )
        for reduce in ("prod", "mean", "amax", "amin")
        for include_self in (True, False)
    ],
    Case(
        "masked_scatter",
        lambda x, m, s: x.masked_scatter(m, s),
        lambda: (_randn(3, 4), _mask(3, 4), _randn(14)),
        [aten.masked_scatter.default],
    ),
    Case(
        "masked_scatter_broadcast",
        lambda x, m, s: x.masked_scatter(m, s),
        lambda: (_randn(4), _mask(3, 4), _randn(3, 4)),
        [aten.masked_scatter.default],
    ),
    Case("topk", lambda x: torch.topk(x, 2), lambda: (_randn(3, 5),), [aten.topk.default]),
    Case(
        "kthvalue",
        lambda x: torch.kthvalue(x, 2),
        lambda: (_randn(3, 5),),
        [aten.kthvalue.default],
    ),
    Case(
        "kthvalue_keepdim",
        lambda x: torch.kthvalue(x, 4, dim=0, keepdim=True),
        lambda: (_randn(4, 2, 3),),
        [aten.kthvalue.default],
    ),
    Case(
        "topk_smallest",
        lambda x: torch.topk(x, 3, dim=0, largest=False),
        lambda: (_randn(4, 2),),
        [aten.topk.default],
    ),
    Case(
        "sort",
        lambda x: torch.sort(x, 0, descending=True),
        lambda: (_randn(4, 3),),
        [aten.sort.default],
    ),
    Case("sort_ties", lambda x: torch.sort(x, stable=True), lambda: (_ties(),), [aten.sort.stable]),
    Case(
        "sort_ties_descending",
        lambda x: torch.sort(x, stable=True, descending=True),
        lambda: (_ties(),),
        [aten.sort.stable],
    ),
    Case(
        "argsort",
        lambda x: torch.argsort(x, dim=1),
        lambda: (_randn(3, 4),),
        [aten.sort.default],
        grad=False,
    ),
    Case("cumsum", lambda x: torch.cumsum(x, -1), lambda: (_randn(3, 4),), [aten.cumsum.default]),
    Case(
        "cumsum_bool",
        lambda x: torch.cumsum(x > 0, 0),
        lambda: (_randn(4, 3),),
        [aten.cumsum.default],
        grad=False,
    ),
    Case("cumprod", lambda x: torch.cumprod(x, 0), lambda: (_randn(4, 3),), [aten.cumprod.default]),
    Case(
        "scatter_reduce_grouped",  # one op for the three sources (_capture/scatter_groups.py)
        lambda x, i, a, b, c: torch.cat(
            [x.scatter_reduce(0, i, s, "amax", include_self=False) for s in (a, b, c)], 1
        ),
        lambda: (
            _randn(4, 5),
            torch.randint(0, 4, (6, 5)),
            _randn(6, 5),
            _randn(6, 5),
            _randn(6, 5),
        ),
        [grouped_scatter],
        grad_inputs=[0, 2, 3, 4],
    ),
    Case(
        "scatter_add_grouped_rows",  # grouped, with the index read before its expansion
        lambda x, i, a, b: torch.stack([x.scatter_add(0, i.expand(6, 5), s) for s in (a, b)]),
        lambda: (_randn(4, 5), torch.randint(0, 4, (6, 1)), _randn(6, 5), _randn(6, 5)),
        [grouped_scatter],
        grad_inputs=[0, 2, 3],
    ),
    Case(
        "bucketize",
        lambda x, b: (torch.bucketize(x, b), torch.bucketize(x, b, right=True, out_int32=True)),
        lambda: (torch.tensor([[3.0, 6, 9], [-1, 1, 140]]), torch.tensor([1.0, 3, 5, 7, 9])),
        [aten.bucketize.Tensor],
        grad=False,
    ),
    Case(
        "bucketize_and_searchsorted_of_a_number",
        lambda b: (torch.bucketize(4.0, b, right=True), torch.searchsorted(b, 5.0)),
        lambda: (torch.tensor([1.0, 3, 5, 7, 9]),),
        [aten.bucketize.Scalar, aten.searchsorted.Scalar],
        grad=False,
    ),
    Case(
        "bucketize_unsorted_boundaries",  # torch's binary search over them, step for step
        lambda x, b: torch.bucketize(x, b),
        lambda: (torch.arange(1.0, 10.0), torch.tensor([1.0, 2, 3, 6, 4, 5])),
        [aten.bucketize.Tensor],
        grad=False,
    ),
    Case(
        "searchsorted_rows_with_sorter",
        lambda s, x, order: (
            torch.searchsorted(s, x, side="right"),
            torch.searchsorted(
                s[:, order], x, sorter=torch.argsort(order).expand(3, 6).contiguous()
            ),
        ),
        lambda: (torch.sort(_randn(3, 6))[0], _randn(3, 4), torch.tensor([2, 0, 5, 1, 4, 3])),
        [aten.searchsorted.Tensor],
        grad=False,
    ),
]
