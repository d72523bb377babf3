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
