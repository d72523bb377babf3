"""Scatter-reduces of one tensor by one index run as one grouped op
(``_capture/scatter_groups``), shown as PopART's ``ScatterReduce`` with its ``group_size``."""

from __future__ import annotations

import json

import torch

import poptorch


def _scatter_reduces(pm) -> list[str]:
    ops = json.loads(pm._debugGetPopartIR())["maingraph"]
    return [op["attributes"]["group_size"] for op in ops if op["type"] == "ScatterReduce"]


def test_independent_scatters_are_one_grouped_op():
    class Three(torch.nn.Module):
        def forward(self, inp, index, a, b, c):
            return [inp.scatter_reduce(0, index, s, "prod") for s in (a, b, c)]

    torch.manual_seed(0)
    inp, index = torch.randn(4, 6), torch.randint(0, 4, (5, 6))
    srcs = [torch.randn(5, 6) for _ in range(3)]
    pm = poptorch.inferenceModel(Three())
    for got, expected in zip(pm(inp, index, *srcs), Three()(inp, index, *srcs)):
        torch.testing.assert_close(got, expected)
    assert _scatter_reduces(pm) == ["3"]


def test_a_scatter_whose_source_reads_an_earlier_result_is_not_grouped():
    class Chained(torch.nn.Module):
        def forward(self, inp, index, a):
            first = inp.scatter_reduce(0, index, a, "sum")
            second = inp.scatter_reduce(0, index, first[:3] * 2, "sum")
            return first, second

    torch.manual_seed(0)
    inp, index, a = torch.randn(4, 6), torch.randint(0, 4, (3, 6)), torch.randn(3, 6)
    pm = poptorch.inferenceModel(Chained())
    for got, expected in zip(pm(inp, index, a), Chained()(inp, index, a)):
        torch.testing.assert_close(got, expected)
    assert _scatter_reduces(pm) == ["1", "1"]
