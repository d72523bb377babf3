"""Op-table cases: gather, tied_gather, groupedgather, scatter, scatter_reduce, onehot, t[int]."""

import numpy as np

import popxl
import popxl.ops as ops

from .harness import OpCase, f32

X = f32(4, 3, seed=21)
X3 = f32(2, 3, 4, seed=22)
IDX = np.array([[2, 0], [3, 3]], np.int32)
OOR = np.array([1, -1, 4, 7, 0], np.int32)


def _np_gather(x, idx, axis=0, zero_oor=False):
    n = x.shape[axis]
    out = np.take(x, np.clip(idx, 0, n - 1), axis=axis)
    if zero_oor:
        valid = ((idx >= 0) & (idx < n)).reshape(
            (1,) * axis + idx.shape + (1,) * (x.ndim - axis - 1)
        )
        out = np.where(valid, out, 0).astype(x.dtype)
    return out


def _np_scatter(out, idx, src, axis, combine):
    """out[.., idx[p], ..] = combine(old, src[p]) for every position p of idx; OOR skipped."""
    out = out.copy()
    for pos in np.ndindex(*idx.shape):
        i = int(idx[pos])
        if not 0 <= i < out.shape[axis]:
            continue
        target = pos[:axis] + (i,) + pos[axis + 1 :]
        out[target] = combine(out[target], src[pos])
    return out


def _overwrite(old, new):
    return new


def _np_scatter_elements(t, idx, values, axis):
    wrapped = np.where(idx < 0, idx + t.shape[axis], idx)
    return _np_scatter(t, wrapped, values, axis, _overwrite)


def _np_onehot(idx, depth, values, axis):
    idx = np.where(idx < 0, idx + depth, idx)
    hot = np.expand_dims(idx, axis) == np.arange(depth).reshape(
        (1,) * axis + (depth,) + (1,) * (idx.ndim - axis)
    )
    return np.where(hot, values[1], values[0]).astype(values.dtype)


def _onehot_build(depth, axis):
    def build(t, values):
        return ops.onehot(t, popxl.constant(np.array(depth, np.int32)), values, axis)

    return build


def _vector_index(idx, data, axis):
    """A vector of indices broadcast over data's other dims (the ScatterReduce broadcast)."""
    return np.broadcast_to(
        idx.reshape((1,) * axis + (-1,) + (1,) * (data.ndim - axis - 1)), data.shape
    )


SR_DATA = f32(5, 3, seed=23)
SR_IDX = np.array([2, 0, 2, 1, 0], np.int32)
SR_FULL_IDX = np.array([[0, 1, 1], [1, 0, 2], [2, 2, 0], [0, 1, 2], [1, 0, 0]], np.int32)
SR_INIT = f32(3, 3, seed=24)


def _sr_ref(reduction, fill, axis_size=3):
    combine = {"sum": np.add, "min": np.minimum, "max": np.maximum}[reduction]

    def ref(d, i):
        out = np.full((axis_size, d.shape[1]), fill, d.dtype)
        return _np_scatter(out, _vector_index(i, d, 0), d, 0, combine)

    return ref


CASES = [
    # gather
    OpCase(
        "gather_axis0", lambda t, i: ops.gather(t, i), [X, IDX], lambda x, i: np.take(x, i, axis=0)
    ),
    OpCase(
        "gather_axis1",
        lambda t, i: ops.gather(t, i, axis=1),
        [X3, np.array([2, 0, 2], np.int32)],
        lambda x, i: np.take(x, i, axis=1),
    ),
    OpCase(
        "gather_negative_axis_uint32",
        lambda t, i: ops.gather(t, i, axis=-1),
        [X3, np.array([[1], [2]], np.uint32)],
        lambda x, i: np.take(x, i, axis=2),
    ),
    OpCase(
        "gather_scalar_index",
        lambda t, i: ops.gather(t, i),
        [X, np.array(2, np.int32)],
        lambda x, i: x[2],
    ),
    OpCase(
        "gather_int_data",
        lambda t, i: ops.gather(t, i),
        [np.arange(12, dtype=np.int32).reshape(4, 3), IDX],
        lambda x, i: np.take(x, i, axis=0),
        grad=False,
    ),
    OpCase(
        "gather_zero_oor",
        lambda t, i: ops.gather(t, i, zero_OOR=True),
        [X, OOR],
        lambda x, i: _np_gather(x, i, zero_oor=True),
    ),
    OpCase(
        "gather_zero_oor_uint32",
        lambda t, i: ops.gather(t, i, axis=1, zero_OOR=True),
        [X, np.array([0, 2, 3, 4_000_000_000], np.uint32)],
        lambda x, i: np.where(i < 3, np.take(x, np.minimum(i, 2), axis=1), 0).astype(x.dtype),
    ),
    OpCase(
        "gather_oor_clamps", lambda t, i: ops.gather(t, i), [X, OOR], lambda x, i: _np_gather(x, i)
    ),
    OpCase(
        "tied_gather",
        lambda t, i: ops.tied_gather(t, i, axis=1),
        [X, np.array([2, 1, 2], np.int32)],
        lambda x, i: np.take(x, i, axis=1),
    ),
    OpCase(
        "tied_gather_zero_oor",
        lambda t, i: ops.tied_gather(t, i, zero_OOR=True),
        [X, OOR],
        lambda x, i: _np_gather(x, i, zero_oor=True),
    ),
    OpCase(
        "groupedgather_axis1",
        lambda t, i: ops.groupedgather(t, i, axis=1, group_size=2),
        [X3, np.array([[2, 0, 2, 1, 1], [1, 1, 0, 0, 2]], np.int32)],
        lambda x, i: np.stack([np.take(x[g], i[g], axis=0) for g in range(2)]),
    ),
    OpCase(
        "groupedgather_axis2",
        lambda t, i: ops.groupedgather(t, i, axis=2, group_size=2),
        [X3, np.array([[[3], [0]], [[1], [5]]], np.int32)],
        lambda x, i: np.stack([_np_gather(x[g], i[g], axis=1) for g in range(2)]),
    ),
    OpCase(
        "groupedgather_group_size_1",
        lambda t, i: ops.groupedgather(t, i),
        [X, IDX],
        lambda x, i: np.take(x, i, axis=0),
    ),
    # Tensor.__getitem__ with integer tensors / nested lists gathers along axis 0
    OpCase(
        "index_int_tensor",
        lambda t, i: (t[i], t[[[0, 1], [1, 1]]]),
        [f32(10, 10, seed=25), np.array([9, 0, 4], np.int32)],
        lambda x, i: (x[i], x[[[0, 1], [1, 1]]]),
    ),
    # scatter (ONNX ScatterElements)
    OpCase(
        "scatter_axis0",
        lambda t, i, v: ops.scatter(t, i, v),
        [X, np.array([[3, 0, 1], [1, 2, 0]], np.int32), f32(2, 3, seed=26)],
        lambda t, i, v: _np_scatter_elements(t, i, v, 0),
    ),
    OpCase(
        "scatter_axis1_negative_index",
        lambda t, i, v: ops.scatter(t, i, v, axis=1),
        [X, np.array([[-1], [0], [1], [-3]], np.int32), f32(4, 1, seed=27)],
        lambda t, i, v: _np_scatter_elements(t, i, v, 1),
    ),
    OpCase(
        "scatter_int",
        lambda t, i, v: ops.scatter(t, i, v, axis=-1),
        [
            np.zeros((2, 4), np.int32),
            np.array([[3, 1], [0, 2]], np.int32),
            np.array([[5, 6], [7, 8]], np.int32),
        ],
        lambda t, i, v: _np_scatter_elements(t, i, v, 1),
        grad=False,
    ),
    # scatter_reduce
    OpCase(
        "scatter_reduce_sum",
        lambda d, i: ops.scatter_reduce(d, i, "sum", axis_size=3),
        [SR_DATA, SR_IDX],
        _sr_ref("sum", 0),
    ),
    OpCase(
        "scatter_reduce_max",
        lambda d, i: ops.scatter_reduce(d, i, "max", axis_size=3),
        [SR_DATA, SR_IDX],
        _sr_ref("max", -np.inf),
    ),
    OpCase(
        "scatter_reduce_min",
        lambda d, i: ops.scatter_reduce(d, i, "min", axis_size=3),
        [SR_DATA, SR_IDX],
        _sr_ref("min", np.inf),
    ),
    OpCase(
        "scatter_reduce_untouched_rows",
        lambda d, i: (
            ops.scatter_reduce(d, i, "max", axis_size=4),
            ops.scatter_reduce(d, i, "min", axis_size=4),
            ops.scatter_reduce(d, i, "sum", axis_size=4),
        ),
        [SR_DATA, np.array([0, 0, 2, 2, 2], np.int32)],
        lambda d, i: (
            _sr_ref("max", -np.inf, 4)(d, i),
            _sr_ref("min", np.inf, 4)(d, i),
            _sr_ref("sum", 0, 4)(d, i),
        ),
        grad=False,
    ),
    OpCase(
        "scatter_reduce_none_initial",
        lambda d, i, init: ops.scatter_reduce(d, i, "none", init),
        [SR_DATA, np.array([2, 5, 0, 7, 1], np.int32), f32(3, 3, seed=28)],
        lambda d, i, init: _np_scatter(init, _vector_index(i, d, 0), d, 0, _overwrite),
    ),
    OpCase(
        "scatter_reduce_sum_initial_full_index",
        lambda d, i, init: ops.scatter_reduce(d, i, "sum", init, axis=0),
        [SR_DATA, SR_FULL_IDX, SR_INIT],
        lambda d, i, init: _np_scatter(init, i, d, 0, np.add),
    ),
    OpCase(
        "scatter_reduce_axis1_negative_dropped",
        lambda d, i: ops.scatter_reduce(d, i, "sum", axis=-1, axis_size=2),
        [f32(2, 4, seed=29), np.array([1, -1, 0, 1], np.int32)],
        lambda d, i: _np_scatter(
            np.zeros((2, 2), np.float32), _vector_index(i, d, 1), d, 1, np.add
        ),
    ),
    OpCase(
        "scatter_reduce_no_broadcast",
        lambda d, i: ops.scatter_reduce(d, i, "sum", axis_size=2, enable_index_broadcast=False),
        [SR_DATA, np.array([[1, 0], [0, 0], [1, 1]], np.uint32)],
        lambda d, i: _np_scatter(
            np.zeros((2, 2), np.float32), i.astype(np.int64), d[:3, :2], 0, np.add
        ),
    ),
    OpCase(
        "scatter_reduce_int_max",
        lambda d, i: ops.scatter_reduce(d, i, "max", axis_size=2),
        [np.array([[3, -4], [5, 1], [-2, 9]], np.int32), np.array([1, 1, 0], np.int32)],
        lambda d, i: np.array([[-2, 9], [5, 1]], np.int32),
        grad=False,
    ),
    # onehot (ONNX OneHot)
    OpCase(
        "onehot_last_axis",
        _onehot_build(5, -1),
        [np.array([[1, 4], [0, -1]], np.int32), np.array([0.0, 1.0], np.float32)],
        lambda t, v: _np_onehot(t, 5, v, 2),
    ),
    OpCase(
        "onehot_axis0_out_of_range",
        _onehot_build(4, 0),
        [np.array([3, 9, -5, 0], np.int32), np.array([-1.0, 2.5], np.float32)],
        lambda t, v: _np_onehot(t, 4, v, 0),
    ),
    OpCase(
        "onehot_middle_axis_int_values",
        _onehot_build(3, 1),
        [np.array([[1, 2], [0, 1]], np.uint32), np.array([0, 7], np.int32)],
        lambda t, v: _np_onehot(t.astype(np.int64), 3, v, 1),
        grad=False,
    ),
]
