"""A program of repeated calls small enough to check by hand."""

from __future__ import annotations

import numpy as np

import popxl
import popxl.ops as ops


def chain_program(conv: str | None = None) -> tuple[popxl.Ir, popxl.DeviceToHostStream]:
    """Three calls of one graph scaling a variable in turn (2 * 3 * 5), then a store.

    ``conv="layers"``: the called graph also passes its product through a 1x1 convolution
    with the identity as its kernel (values unchanged); ``conv="after"``: the main graph
    convolves ones by the result after the calls (their sum)."""
    ir = popxl.Ir()

    def scale(t: popxl.Tensor, s: popxl.Tensor) -> popxl.Tensor:
        product = t * s
        if conv != "layers":
            return product
        identity = popxl.constant(np.eye(2, dtype=np.float32).reshape(2, 2, 1, 1))
        return ops.conv(product.reshape((1, 2, 1, 1)), identity).reshape((2,))

    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32), name="x")
        scales = [popxl.variable(np.full(2, s, np.float32), name=f"s{s}") for s in (2, 3, 5)]
        mul = ir.create_graph(scale, x, scales[0])
        h = x
        for s in scales:
            (h,) = ops.call(mul, h, s)
        if conv == "after":
            image = popxl.constant(np.ones((1, 2, 1, 1), np.float32))
            h = ops.conv(image, ops.reshape(h, (1, 2, 1, 1))).reshape((1,))
        out = popxl.d2h_stream(h.shape, popxl.float32, "out")
        ops.host_store(out, h)
    return ir, out
