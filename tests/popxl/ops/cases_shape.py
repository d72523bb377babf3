"""Op-table cases: reshape, transpose, slice, subsample, concat, split, cast, indexing."""

import numpy as np

import popxl
import popxl.ops as ops

from .harness import OpCase, f32, i32

X = f32(2, 3, 4, seed=5)
M = f32(4, 6, seed=6)


def _write_through(view_fn, update_shape):
    # A write through the view must reach the base tensor.
    def build(x):
        v = view_fn(x)
        ops.add_(v, popxl.constant(np.ones(update_shape), x.dtype))
        return x

    return build


CASES = [
    OpCase("reshape", lambda t: ops.reshape(t, (4, -1)), [X], lambda x: x.reshape(4, -1)),
    OpCase("reshape_method", lambda t: t.reshape((24,)), [X], lambda x: x.reshape(24)),
    OpCase(
        "reshape_view_write",
        _write_through(lambda t: ops.reshape_(t, (6, 4)), (6, 4)),
        [X],
        lambda x: x + 1,
    ),
    OpCase("flatten", ops.flatten, [X], lambda x: x.reshape(-1)),
    OpCase("flatten_view_write", _write_through(ops.flatten_, (24,)), [X], lambda x: x + 1),
    OpCase(
        "squeeze", lambda t: ops.squeeze(t, [0, 2]), [f32(1, 3, 1, 2)], lambda x: x.reshape(3, 2)
    ),
    OpCase("squeeze_all", ops.squeeze, [f32(1, 3, 1)], lambda x: x.reshape(3)),
    OpCase("transpose", lambda t: ops.transpose(t, (1, 2, 0)), [X], lambda x: x.transpose(1, 2, 0)),
    OpCase(
        "transpose_default_and_T",
        lambda t: (ops.transpose(t), t.T, t.T.T),
        [M],
        lambda x: (x.T, x.T, x),
    ),
    # PopART reversed the axes for an empty permutation; negative entries as in NumPy.
    OpCase("transpose_empty_permutation", lambda t: ops.transpose(t, ()), [X], np.transpose),
    OpCase(
        "transpose_negative_permutation",
        lambda t: ops.transpose(t, (-1, 0, -2)),
        [X],
        lambda x: x.transpose(2, 0, 1),
    ),
    OpCase(
        "transpose_view_write",
        _write_through(lambda t: ops.transpose_(t, (2, 0, 1)), (4, 2, 3)),
        [X],
        lambda x: x + 1,
    ),
    OpCase("T_view_write", _write_through(lambda t: t.T_, (6, 4)), [M], lambda x: x + 1),
    OpCase(
        "slice", lambda t: ops.slice(t, [1, 0], [3, -1], axis=[0, 1]), [M], lambda x: x[1:3, 0:-1]
    ),
    OpCase(
        "slice_negative_step",
        lambda t: ops.slice(t, start=-1, stop=0, step=-1, axis=1),
        [M],
        lambda x: x[:, :0:-1],
    ),
    # PopXL filled None entries with their defaults.
    OpCase(
        "slice_none_entries",
        lambda t: ops.slice(t, start=[None, 2], stop=[3, None], step=[None, -1], axis=[0, 1]),
        [M],
        lambda x: x[:3, 2::-1],
    ),
    OpCase(
        "slice_out_of_range_bounds_clamp",
        lambda t: ops.slice(t, start=[-10, 2], stop=[10, 100], axis=[0, 1]),
        [M],
        lambda x: x[-10:10, 2:100],
    ),
    OpCase(
        "slice_view_write",
        _write_through(lambda t: ops.slice_(t, 1, 3, axis=0), (2, 6)),
        [M],
        lambda x: x + np.array([0, 1, 1, 0], np.float32)[:, None],
    ),
    OpCase("subsample", lambda t: ops.subsample(t, [2, 4]), [M], lambda x: x[::2, ::4]),
    OpCase(
        "concat",
        lambda a, b: ops.concat([a, b], axis=1),
        [M, f32(4, 2, seed=7)],
        lambda a, b: np.concatenate([a, b], 1),
    ),
    OpCase(
        "concat_view_write",
        lambda a, b: _concat_write(a, b),
        [f32(2, 3), f32(1, 3, seed=8)],
        lambda a, b: (a + 1, b + 1),
    ),
    OpCase(
        "split_equal",
        lambda t: ops.split(t, 2, axis=1),
        [M],
        lambda x: tuple(np.split(x, 2, axis=1)),
    ),
    OpCase("split_lengths", lambda t: ops.split(t, [1, 3]), [M], lambda x: (x[:1], x[1:])),
    OpCase(
        "cast_float_to_int",
        lambda t: ops.cast(t, popxl.int32),
        [X * 3],
        lambda x: (x * 1).astype(np.int32),
        grad=False,
    ),
    OpCase(
        "cast_int_to_float16",
        lambda t: ops.cast(t, popxl.float16),
        [i32(5)],
        lambda x: x.astype(np.float16),
        grad=False,
    ),
    OpCase(
        "cast_to_bool", lambda t: ops.cast(t, popxl.bool), [i32(5)], lambda x: x != 0, grad=False
    ),
    OpCase(
        "index_int_and_slices",
        lambda t: (t[1], t[0, 1:3], t[-1], t[:, ::2], t[1, -2]),
        [X],
        lambda x: (x[1], x[0, 1:3], x[-1], x[:, ::2], x[1, -2]),
    ),
    OpCase("index_negative_step", lambda t: t[3:0:-2], [M], lambda x: x[3:0:-2]),
    OpCase(
        "index_bool_mask",
        lambda t: t[np.array([[True], [False], [True], [False]])],
        [M],
        lambda x: np.where(np.array([[True], [False], [True], [False]]), x, 0),
    ),
    OpCase("diag", lambda t: (t.diag(),), [M], lambda x: (np.diag(x),)),
]


def _concat_write(a, b):
    c = ops.concat_([a, b], axis=0)
    ops.add_(c, popxl.constant(np.ones((3, 3)), a.dtype))
    return a, b
