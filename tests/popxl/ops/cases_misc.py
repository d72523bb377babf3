"""Op-table cases: print_tensor (a pass-through copy), ipu_copy and io_tile_copy (identities)."""

import numpy as np

import popxl.ops as ops

from .harness import OpCase, f32

X = f32(2, 3, seed=21)

CASES = [
    OpCase(
        "print_tensor_passes_through",
        lambda x: ops.print_tensor(x, "x_value") * 2.0,
        [X],
        lambda x: 2 * x,
    ),
    OpCase(
        "print_tensor_print_self_false",
        lambda x: ops.print_tensor(x, print_self=False),
        [X],
        lambda x: x,
    ),
    OpCase("ipu_copy", lambda x: ops.ipu_copy(x, 1) + 1.0, [X], lambda x: x + 1),
    OpCase(
        "ipu_copy_int",
        lambda x: ops.ipu_copy(x, 1, source=0),
        [np.arange(4, dtype=np.int32)],
        lambda x: x,
        grad=False,
    ),
    OpCase("io_tile_copy", ops.io_tile_copy, [X], lambda x: x),
]
