"""Op-table cases: dynamic_slice, dynamic_update, dynamic_update_."""

import numpy as np

import popxl.ops as ops

from .harness import OpCase, f32

T = f32(4, 5, seed=31)
T3 = f32(3, 4, 2, seed=32)


def _np_clamped_starts(shape, index, axes, sizes):
    starts = [0] * len(shape)
    for off, a, s in zip(np.asarray(index).reshape(-1), axes, sizes):
        starts[a] = int(min(max(int(off), 0), shape[a] - s))
    return starts


def _np_block(shape, index, axes, sizes):
    starts = _np_clamped_starts(shape, index, axes, sizes)
    stops = list(shape)
    for a, s in zip(axes, sizes):
        stops[a] = starts[a] + s
    return tuple(slice(b, e) for b, e in zip(starts, stops))


def _slice_ref(axes, sizes):
    return lambda t, i: t[_np_block(t.shape, i, axes, sizes)]


def _update_ref(axes, sizes):
    def ref(t, i, u):
        out = t.copy()
        out[_np_block(t.shape, i, axes, sizes)] = u
        return out

    return ref


def _update_inplace(axes, sizes):
    def build(t, i, u):
        out = ops.dynamic_update_(t, i, u, axes, sizes, False)
        return out, t

    return build


def _both(ref):
    return lambda *xs: (ref(*xs), ref(*xs))


CASES = [
    OpCase(
        "dynamic_slice_one_axis",
        lambda t, i: ops.dynamic_slice(t, i, [1], [2], True),
        [T, np.array([2], np.uint32)],
        _slice_ref([1], [2]),
    ),
    OpCase(
        "dynamic_slice_two_axes",
        lambda t, i: ops.dynamic_slice(t, i, [0, 2], [2, 1], False),
        [T3, np.array([1, 1], np.int32)],
        _slice_ref([0, 2], [2, 1]),
    ),
    OpCase(
        "dynamic_slice_negative_axis_reversed_order",
        lambda t, i: ops.dynamic_slice(t, i, [-1, 0], [3, 1], False),
        [T, np.array([2, 3], np.int32)],
        _slice_ref([1, 0], [3, 1]),
    ),
    OpCase(
        "dynamic_slice_offset_clamped",
        lambda t, i: ops.dynamic_slice(t, i, [0, 1], [2, 2], False),
        [T, np.array([3, 9], np.uint32)],
        _slice_ref([0, 1], [2, 2]),
    ),
    OpCase(
        "dynamic_slice_int",
        lambda t, i: ops.dynamic_slice(t, i, [0], [2], False),
        [np.arange(12, dtype=np.int32).reshape(6, 2), np.array([3], np.int32)],
        _slice_ref([0], [2]),
        grad=False,
    ),
    OpCase(
        "dynamic_update",
        lambda t, i, u: ops.dynamic_update(t, i, u, [0], [2], False),
        [T, np.array([1], np.uint32), f32(2, 5, seed=33)],
        _update_ref([0], [2]),
    ),
    OpCase(
        "dynamic_update_two_axes_clamped",
        lambda t, i, u: ops.dynamic_update(t, i, u, [1, 2], [3, 1], True),
        [T3, np.array([5, 1], np.int32), f32(3, 3, 1, seed=34)],
        _update_ref([1, 2], [3, 1]),
    ),
    OpCase(
        "dynamic_update_inplace",
        _update_inplace([1], [2]),
        [T, np.array([3], np.uint32), f32(4, 2, seed=35)],
        _both(_update_ref([1], [2])),
    ),
]
