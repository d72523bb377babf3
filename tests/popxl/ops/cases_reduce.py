"""Op-table cases: axis reductions, argmax/argmin, cumsum, topk, lamb_square, histogram.

Inputs of max/min/median/topk have no ties (random floats), so their gradients are defined.
"""

import numpy as np

import popxl.ops as ops

from .harness import OpCase, f32, i32

X = f32(3, 4, seed=11)
X3 = f32(2, 3, 4, seed=12)
POS = f32(3, 4, seed=13, low=0.1, high=2.0)
EVEN = f32(4, 3, seed=14)  # 4 rows: an even count along axis 0
INTS = i32(3, 4, seed=15, low=-9, high=9)
HALF = f32(3, 4, seed=16).astype(np.float16)


def _lower_median(x, axis=None, keepdims=False):
    axes = tuple(range(x.ndim)) if axis is None else tuple(np.atleast_1d(axis) % max(x.ndim, 1))
    moved = np.moveaxis(x, axes, tuple(range(-len(axes), 0)))
    rows = moved.reshape(moved.shape[: x.ndim - len(axes)] + (-1,))
    out = np.sort(rows, axis=-1)[..., (rows.shape[-1] - 1) // 2]
    if keepdims:
        out = out.reshape([1 if d in axes else n for d, n in enumerate(x.shape)])
    return out


def _as(dtype, fn):
    return lambda *xs: np.asarray(fn(*xs)).astype(dtype)


def _half(fn):
    """A float16 reference: computed in float32 (or wider) and rounded to the input dtype."""
    return lambda x: np.asarray(fn(x.astype(np.promote_types(x.dtype, np.float32)))).astype(x.dtype)


def _sum_of_squares_f32(x):
    """float32 (or wider, for float64 gradient checks), whatever the input float dtype."""
    x = x.astype(np.promote_types(x.dtype, np.float32))
    return (x * x).sum()


def _trunc_mean(x, axis):
    return np.trunc(x.sum(axis=axis) / x.shape[axis]).astype(np.int32)


def _logsumexp(x, axis, keepdims=False):
    m = x.max(axis=axis, keepdims=True)
    out = np.log(np.exp(x - m).sum(axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def _topk(x, k, axis, largest):
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int32)


def _histogram(x, levels, absolute):
    x = np.abs(x) if absolute else x
    edges = [-np.inf, *levels, np.inf]
    counts = [np.sum((x >= lo) & (x < hi)) for lo, hi in zip(edges[:-1], edges[1:])]
    counts[-1] += np.sum(x == np.inf)
    return np.array(counts, np.uint32)


F = np.float32
AXIS_CASES = [
    OpCase("sum_all", ops.sum, [X], lambda x: x.sum()),
    OpCase(
        "sum_axis1_keepdims",
        lambda t: ops.sum(t, 1, keepdims=True),
        [X],
        lambda x: x.sum(axis=1, keepdims=True),
    ),
    OpCase("sum_negative_axes", lambda t: ops.sum(t, [-1, 0]), [X3], lambda x: x.sum(axis=(0, 2))),
    OpCase("sum_no_axes", lambda t: ops.sum(t, []), [X], lambda x: x),
    OpCase(
        "sum_int",
        lambda t: ops.sum(t, 0),
        [INTS],
        _as(np.int32, lambda x: x.sum(axis=0)),
        grad=False,
    ),
    OpCase(
        "sum_fp16",
        lambda t: ops.sum(t, -1),
        [HALF],
        _half(lambda x: x.sum(-1)),
        rtol=1e-2,
        atol=1e-2,
        grad_rtol=2e-2,
        grad_atol=2e-2,
    ),
    OpCase("mean_axis0", lambda t: ops.mean(t, 0), [X], lambda x: x.mean(axis=0)),
    OpCase(
        "mean_several_axes_keepdims",
        lambda t: ops.mean(t, (0, 2), True),
        [X3],
        lambda x: x.mean(axis=(0, 2), keepdims=True),
    ),
    OpCase(
        "mean_int_truncates",
        lambda t: ops.mean(t, 1),
        [INTS],
        lambda x: _trunc_mean(x, 1),
        grad=False,
    ),
    OpCase("prod_last_axis", lambda t: ops.prod(t, -1), [X], lambda x: x.prod(axis=-1), rtol=1e-5),
    OpCase(
        "prod_int",
        lambda t: ops.prod(t, 0),
        [i32(3, 4, seed=17, low=-3, high=4)],
        _as(np.int32, lambda x: x.prod(axis=0)),
        grad=False,
    ),
    OpCase("max_all", ops.max, [X], lambda x: x.max()),
    OpCase(
        "max_several_axes_keepdims",
        lambda t: ops.max(t, [0, -1], keepdims=True),
        [X3],
        lambda x: x.max(axis=(0, 2), keepdims=True),
    ),
    OpCase("max_int", lambda t: ops.max(t, 1), [INTS], lambda x: x.max(axis=1), grad=False),
    OpCase("min_axis0", lambda t: ops.min(t, 0), [X], lambda x: x.min(axis=0)),
    OpCase(
        "min_fp16",
        lambda t: ops.min(t, 1, True),
        [HALF],
        lambda x: x.min(1, keepdims=True),
        rtol=1e-3,
        grad_rtol=2e-2,
        grad_atol=2e-2,
    ),
    OpCase(
        "median_odd_axis1",
        lambda t: ops.median(t, 1),
        [f32(4, 5, seed=18)],
        lambda x: _lower_median(x, 1),
    ),
    OpCase(
        "median_even_is_lower", lambda t: ops.median(t, 0), [EVEN], lambda x: np.sort(x, axis=0)[1]
    ),
    OpCase(
        "median_all_keepdims",
        lambda t: ops.median(t, keepdims=True),
        [X3],
        lambda x: _lower_median(x, keepdims=True),
    ),
    OpCase(
        "median_several_axes",
        lambda t: ops.median(t, [0, 2]),
        [X3],
        lambda x: _lower_median(x, (0, 2)),
    ),
    OpCase(
        "median_int",
        lambda t: ops.median(t, -1),
        [INTS],
        lambda x: _lower_median(x, -1),
        grad=False,
    ),
    OpCase("sumsquare", lambda t: ops.sumsquare(t, 1), [X], lambda x: (x * x).sum(axis=1)),
    OpCase(
        "sumsquare_int", ops.sumsquare, [INTS], _as(np.int32, lambda x: (x * x).sum()), grad=False
    ),
    OpCase(
        "l1",
        lambda t: ops.l1(t, [0, 1], keepdims=True),
        [X3],
        lambda x: np.abs(x).sum(axis=(0, 1), keepdims=True),
    ),
    OpCase("l2", lambda t: ops.l2(t, -1), [X], lambda x: np.sqrt((x * x).sum(axis=-1))),
    OpCase(
        "l2_fp16",
        lambda t: ops.l2(t, 0),
        [HALF],
        _half(lambda x: np.sqrt((x**2).sum(axis=0))),
        rtol=1e-2,
        grad_rtol=2e-2,
        grad_atol=2e-2,
    ),
    OpCase(
        "l2_int_truncates",
        lambda t: ops.l2(t, 1),
        [INTS],
        _as(np.int32, lambda x: np.sqrt((x.astype(F) ** 2).sum(axis=1))),
        grad=False,
    ),
    OpCase("logsum", lambda t: ops.logsum(t, 0), [POS], lambda x: np.log(x.sum(axis=0))),
    OpCase(
        "logsumexp",
        lambda t: ops.logsumexp(t, [1, 2], True),
        [X3 * 20],
        lambda x: _logsumexp(x, (1, 2), keepdims=True),
        rtol=1e-5,
        atol=1e-5,
    ),
    OpCase(
        "logsumexp_fp16",
        lambda t: ops.logsumexp(t, -1),
        [HALF],
        _half(lambda x: _logsumexp(x, -1)),
        rtol=1e-2,
        atol=1e-2,
        grad_rtol=2e-2,
        grad_atol=2e-2,
    ),
]

TIES = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, -1.0]], np.float32)
ARG_CASES = [
    OpCase("argmax_dim0", ops.argmax, [X], lambda x: x.argmax(0).astype(np.int32), grad=False),
    OpCase(
        "argmax_negative_dim_keepdim",
        lambda t: ops.argmax(t, -1, keepdim=True),
        [X3],
        lambda x: x.argmax(-1)[..., None].astype(np.int32),
        grad=False,
    ),
    OpCase(
        "argmax_ties_first",
        lambda t: ops.argmax(t, 1),
        [TIES],
        lambda x: np.array([1, 0], np.int32),
        grad=False,
    ),
    OpCase(
        "argmax_flattened",
        lambda t: ops.argmax(t, None),
        [X],
        lambda x: np.int32(x.argmax()),
        grad=False,
    ),
    OpCase(
        "argmin_dim1",
        lambda t: ops.argmin(t, 1),
        [X],
        lambda x: x.argmin(1).astype(np.int32),
        grad=False,
    ),
    OpCase(
        "argmin_ties_first_int",
        lambda t: ops.argmin(t, -1),
        [TIES.astype(np.int32)],
        lambda x: np.array([3, 2], np.int32),
        grad=False,
    ),
]

CUMSUM_CASES = [
    OpCase("cumsum_dim0", ops.cumsum, [X], lambda x: np.cumsum(x, 0), atol=1e-5),
    OpCase("cumsum_dim1", lambda t: ops.cumsum(t, 1), [X3], lambda x: np.cumsum(x, 1), atol=1e-5),
    OpCase(
        "cumsum_negative_dim",
        lambda t: ops.cumsum(t, -1),
        [X3],
        lambda x: np.cumsum(x, -1),
        atol=1e-5,
    ),
    OpCase(
        "cumsum_int",
        lambda t: ops.cumsum(t, -1),
        [INTS],
        _as(np.int32, lambda x: np.cumsum(x, -1)),
        grad=False,
    ),
]

TOPK_CASES = [
    OpCase(
        "topk_largest_last_axis",
        lambda t: ops.topk(t, 2, -1, True, True),
        [X3],
        lambda x: _topk(x, 2, -1, True),
        grad=[0],
    ),
    OpCase(
        "topk_smallest_axis0",
        lambda t: ops.topk(t, 3, 0, False, False),
        [EVEN],
        lambda x: _topk(x, 3, 0, False),
        grad=[0],
    ),
    OpCase(
        "topk_full_axis",
        lambda t: ops.topk(t, 4, 1, True, True),
        [X],
        lambda x: _topk(x, 4, 1, True),
        grad=[0],
    ),
    OpCase(
        "topk_ties_lower_index_first",
        lambda t: ops.topk(t, 3, 1, True, True),
        [TIES],
        lambda x: (
            np.array([[3, 3, 1], [2, 2, -1]], np.float32),
            np.array([[1, 2, 0], [0, 1, 2]], np.int32),
        ),
        grad=False,
    ),
    OpCase(
        "topk_int",
        lambda t: ops.topk(t, 2, 1, False, True),
        [INTS],
        lambda x: _topk(x, 2, 1, False),
        grad=False,
    ),
]

LEVELS = [-1.0, 0.0, 0.5, 1.5]
# Values on the levels check the edge rule: each bin includes its lower level.
HIST_X = np.array([[-2.0, -1.0, -0.5, 0.0], [0.25, 0.5, 1.0, 1.5], [2.0, -1.5, 0.5, 3.0]], F)
OTHER_CASES = [
    OpCase("lamb_square", ops.lamb_square, [X3], _sum_of_squares_f32, rtol=1e-5),
    OpCase(
        "lamb_square_fp16_gives_fp32",
        ops.lamb_square,
        [HALF],
        _sum_of_squares_f32,
        rtol=1e-5,
        grad_rtol=2e-2,
        grad_atol=2e-2,
    ),
    OpCase(
        "histogram",
        lambda t: ops.histogram(t, LEVELS, False),
        [HIST_X],
        lambda x: _histogram(x, LEVELS, False),
        grad=False,
    ),
    OpCase(
        "histogram_expected_counts",
        lambda t: ops.histogram(t, LEVELS, False),
        [HIST_X],
        lambda x: np.array([2, 2, 2, 3, 3], np.uint32),
        grad=False,
    ),
    OpCase(
        "histogram_absolute",
        lambda t: ops.histogram(t, LEVELS, True),
        [HIST_X],
        lambda x: _histogram(x, LEVELS, True),
        grad=False,
    ),
    # PopART sorted the levels; the bin between two equal levels stays empty.
    OpCase(
        "histogram_unsorted_repeated_levels",
        lambda t: ops.histogram(t, [1.5, 0.0, -1.0, 0.5, 0.0], False),
        [HIST_X],
        lambda x: _histogram(x, [-1.0, 0.0, 0.0, 0.5, 1.5], False),
        grad=False,
    ),
    OpCase(
        "histogram_no_levels",
        lambda t: ops.histogram(t, [], False),
        [X],
        lambda x: np.array([x.size], np.uint32),
        grad=False,
    ),
]

CASES = [*AXIS_CASES, *ARG_CASES, *CUMSUM_CASES, *TOPK_CASES, *OTHER_CASES]
