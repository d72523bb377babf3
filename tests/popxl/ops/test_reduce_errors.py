"""Argument errors of the reduction ops, plus their recorded names and types."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import dtypes


def _in_main(fn):
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((2, 3), np.float32), name="x")
        return fn(x), ir.main_graph


@pytest.mark.parametrize("op", [ops.sum, ops.mean, ops.max, ops.median, ops.logsumexp])
@pytest.mark.parametrize("axis", [2, -3, [0, 5]])
def test_axis_out_of_range(op, axis):
    with pytest.raises(ValueError, match="out of range for a tensor of rank 2"):
        _in_main(lambda x: op(x, axis))


@pytest.mark.parametrize("axis", [1.0, "0", [0, 1.5], [True]])
def test_axis_of_wrong_type(axis):
    with pytest.raises(TypeError, match="`axis` must be None, an int or an iterable of ints"):
        _in_main(lambda x: ops.prod(x, axis))


@pytest.mark.parametrize("op", [ops.argmax, ops.argmin, ops.cumsum])
def test_dim_out_of_range(op):
    with pytest.raises(ValueError, match="dim 2 is out of range"):
        _in_main(lambda x: op(x, 2))


@pytest.mark.parametrize("k", [0, 4, -1, 1.5, True])
def test_topk_k_outside_axis_size(k):
    with pytest.raises(ValueError, match=r"k must be an int in \[1, 3\]"):
        _in_main(lambda x: ops.topk(x, k, axis=1, largest=True, sorted=True))


def test_topk_axis_out_of_range():
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        _in_main(lambda x: ops.topk(x, 1, axis=2, largest=True, sorted=True))


def test_topk_of_scalar():
    with pytest.raises(ValueError, match="rank >= 1"):
        _in_main(lambda x: ops.topk(ops.sum(x), 1, axis=0, largest=True, sorted=True))


def test_output_names_types_and_dtypes():
    def build(x):
        values, indices = ops.topk(x, 2, axis=-1, largest=False, sorted=True)
        return [
            ops.sum(x),
            ops.median(x, 0),
            ops.logsumexp(x, keepdims=True),
            ops.argmax(x),
            ops.cumsum(x, -1),
            values,
            indices,
            ops.lamb_square(x),
            ops.histogram(x, [0.0], True),
        ]

    outs, graph = _in_main(build)
    assert [t.name for t in outs] == [
        "sum_out",
        "median_out",
        "logsumexp_out",
        "argmax_out",
        "cumsum_out",
        "topk_out_value",
        "topk_out_indices",
        "lamb_square_out",
        "histogram_out",
    ]
    assert [t.dtype for t in outs[3:]] == [
        dtypes.int32,
        dtypes.float32,
        dtypes.float32,
        dtypes.int32,
        dtypes.float32,
        dtypes.uint32,
    ]
    assert [t.shape for t in outs] == [(), (3,), (1, 1), (3,), (2, 3), (2, 2), (2, 2), (), (2,)]
    types = [op.type for op in graph._ops]
    assert types == [
        "TopK",
        "ReduceSum",
        "ReduceMedian",
        "ReduceLogSumExp",
        "ArgMax",
        "CumSum",
        "LambSquare",
        "Histogram",
    ]


def test_cumsum_records_dim_constant():
    out, graph = _in_main(lambda x: ops.cumsum(x, -1))
    dim = out._producer.inputs[1]
    assert dim.name == "dim"
    assert isinstance(dim, popxl.Constant)
    assert int(dim._data) == 1
