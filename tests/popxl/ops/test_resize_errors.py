"""Grid sampling: argument errors, names and op types."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import PopXLException


def _var(*shape, dtype=popxl.float32, name="x"):
    return popxl.variable(np.ones(shape, np.float32), dtype, name=name)


def test_grid_sample_name_type_and_shape():
    ir = popxl.Ir()
    with ir.main_graph:
        y = ops.grid_sample(_var(2, 3, 5, 6), _var(2, 4, 7, 2, name="grid"))
        z = ops.grid_sample(_var(1, 3, 4, 5, 6), _var(1, 2, 3, 4, 3, name="grid"), "nearest")
    assert (y.name, y.shape, y.dtype) == ("grid_sample_out", (2, 3, 4, 7), popxl.float32)
    assert z.shape == (1, 3, 2, 3, 4)
    assert [op.type for op in ir.main_graph.ops][-2:] == ["GridSample", "GridSample"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "linear"}, "grid_sample mode 'linear' is not valid"),
        ({"padding_mode": "circular"}, "grid_sample padding mode 'circular' is not valid"),
    ],
)
def test_grid_sample_bad_arguments(kwargs, message):
    with popxl.Ir().main_graph:
        with pytest.raises(ValueError, match=message):
            ops.grid_sample(_var(1, 2, 4, 4), _var(1, 3, 3, 2, name="grid"), **kwargs)


@pytest.mark.parametrize(
    "grid_shape",
    [
        (1, 3, 3, 3),  # three coordinates for a 2-D input
        (2, 3, 3, 2),  # another batch size
        (1, 3, 2),  # no output spatial axes for a 2-D input
    ],
)
def test_grid_sample_shape_errors(grid_shape):
    with popxl.Ir().main_graph:
        with pytest.raises(PopXLException, match="one coordinate per spatial axis"):
            ops.grid_sample(_var(1, 2, 4, 4), _var(*grid_shape, name="grid"))


def test_grid_sample_dtype_errors():
    with popxl.Ir().main_graph:
        x = _var(1, 2, 4, 4)
        with pytest.raises(PopXLException, match="GridSample"):
            ops.grid_sample(x, _var(1, 3, 3, 2, dtype=popxl.float16, name="grid"))
        with pytest.raises(PopXLException, match="must be float16 or float32"):
            ops.grid_sample(
                _var(1, 2, 4, 4, dtype=popxl.int32), _var(1, 3, 3, 2, dtype=popxl.int32)
            )
