"""Argument checks of the shape ops (PopXL's error openings kept)."""

import re

import numpy as np
import pytest

import popxl
import popxl.ops as ops


@pytest.mark.parametrize("concat", [ops.concat, ops.concat_])
@pytest.mark.parametrize(
    "first, second",
    [
        (popxl.float32, popxl.int32),
        (popxl.float8_143, popxl.float8_152),
    ],
)
def test_concat_of_different_dtypes(concat, first, second):
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones((2, 2), np.float32), first)
        b = popxl.variable(np.ones((2, 2), np.float32), second)
        message = (
            f"All inputs to a concat operation must have the same type: [{first!r}, {second!r}]. "
            "Cast them to one dtype first (ops.cast; float8 data via "
            "ops.pow2scale_cast_from_fp8)."
        )
        with pytest.raises(TypeError, match=re.escape(message)):
            concat([a, b], 0)
        assert concat([a, a], 0).shape == (4, 2)


@pytest.mark.parametrize("concat", [ops.concat, ops.concat_])
def test_concat_of_scalars_is_refused(concat):
    # Found by the differential tests' invalid programs: an IndexError from shape inference.
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(1.0, popxl.float32)
        before = len(ir.main_graph._ops)
        with pytest.raises(ValueError, match=r"concat: axis 0 is out of range for scalar"):
            concat([a, a], 0)
        assert len(ir.main_graph._ops) == before


@pytest.mark.parametrize("perm", [(0, 0, 1), (0, 1), (0, 1, 3), (0, 1, -4)])
def test_transpose_permutation_must_name_each_axis_once(perm):
    # PopART failed on these too (wrong rank, or a repeated/missing axis at lowering).
    with popxl.Ir().main_graph:
        t = popxl.variable(np.ones((2, 3, 4), np.float32))
        with pytest.raises(ValueError, match=r"must name each of the axes 0\.\.2 exactly once"):
            ops.transpose(t, perm)


def test_slice_axis_entries_cannot_be_none():
    with popxl.Ir().main_graph:
        t = popxl.variable(np.ones((2, 3), np.float32))
        with pytest.raises(ValueError, match="axis entries cannot be None"):
            ops.slice(t, start=[0, 1], axis=[0, None])
