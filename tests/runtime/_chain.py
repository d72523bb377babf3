"""A program of repeated calls small enough to check by hand."""

from __future__ import annotations

import numpy as np

import popxl
import popxl.ops as ops


def chain_program(conv: bool = False) -> tuple[popxl.Ir, popxl.DeviceToHostStream]:
    """Three calls of one graph scaling a variable in turn (2 * 3 * 5), then a store; with
    ``conv``, a 1x1 convolution of ones by the result too."""
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32), name="x")
        scales = [popxl.variable(np.full(2, s, np.float32), name=f"s{s}") for s in (2, 3, 5)]
        mul = ir.create_graph(lambda t, s: t * s, x, scales[0])
        h = x
        for s in scales:
            (h,) = ops.call(mul, h, s)
        if conv:
            image = popxl.constant(np.ones((1, 2, 1, 1), np.float32))
            h = ops.conv(image, ops.reshape(h, (1, 2, 1, 1))).reshape((1,))
        out = popxl.d2h_stream(h.shape, popxl.float32, "out")
        ops.host_store(out, h)
    return ir, out
