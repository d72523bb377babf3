"""Op-table cases: accumulators, optimizer updaters and weight updates (all in place).

Each in-place case returns the op's handle *and* the original tensor: both must show the
update.
"""

import numpy as np

from popxl.ops import var_updates as vu

from .harness import OpCase, f32

T = f32(3, 4, seed=31)
X = f32(3, 4, seed=32)
M = f32(3, 4, seed=33)
V = f32(3, 4, seed=34, low=0.01, high=1.0)  # second moments are positive
W = f32(3, 4, seed=35)
HALF = np.array(0.5, np.float32)
F32 = np.float32


def _both(fn):
    """Build ``fn(t, *rest)`` and return (handle, t): both must hold the update."""

    def build(t, *rest):
        out = fn(t, *rest)
        return out, t

    return build


def _twice(ref):
    def reference(*xs):
        r = np.asarray(ref(*xs)).astype(xs[0].dtype)
        return r, r

    return reference


def _case(name, fn, inputs, ref, **kw):
    return OpCase(name, _both(fn), inputs, _twice(ref), grad=False, **kw)


def _adam_ref(m, v, eps, step=None, b1=None, b2=None, w=None, wd=None, mode="adam"):
    m, v = m.astype(np.float64), v.astype(np.float64)
    if step is not None:
        t = step + 1
        m = m / (1 - b1**t)
        v = v if mode == "adamax" else v / (1 - b2**t)
    denominator = v if mode == "adamax" else np.sqrt(v)
    x = m / (denominator + eps)
    if wd is not None:
        x = x + wd * w
    return x.astype(np.float32)


def _sparse_ref(t, x, idx, axis, f):
    t = np.moveaxis(t.copy(), axis, 0)
    rows = np.moveaxis(x, tuple(range(axis, axis + idx.ndim)), tuple(range(idx.ndim)))
    rows = rows.reshape(-1, *t.shape[1:])
    for i, r in zip(idx.reshape(-1), rows):
        if 0 <= i < t.shape[0]:
            t[i] += f * r
    return np.moveaxis(t, 0, axis)


def _lamb_ratio(r1, r2, mwn):
    if r1 == 0 or r2 == 0 or mwn == 0:
        return 1.0
    return min(np.sqrt(r1), mwn) / np.sqrt(r2)


def _updater_with_step(fn, **kw):
    def build(m, v, step, *rest):
        return fn(m, v, time_step=step, **kw), step

    return build


def _updater_with_step_and_tensors(m, v, w, step, wd, b1, b2):
    out = vu.lamb_updater(
        m, v, weight=w, time_step=step, weight_decay=wd, beta1=b1, beta2=b2, epsilon=1e-4
    )
    return out, step


def _adam_var_update_tensors(t, x, r1, r2, lr, mwn):
    return vu.adam_var_update(t, x, r1, r2, learning_rate=lr, max_weight_norm=mwn)


STEP = np.array(2.0, np.float32)
R1, R2 = np.array(4.0, F32), np.array(9.0, F32)

CASES = [
    _case("accumulate_", lambda t, x: vu.accumulate_(t, x), [T, X], lambda t, x: t + x),
    _case(
        "accumulate_float_factor",
        lambda t, x: vu.accumulate_(t, x, 0.5),
        [T, X],
        lambda t, x: t + 0.5 * x,
    ),
    _case(
        "accumulate_tensor_factor",
        lambda t, x, f: vu.accumulate_(t, x, f),
        [T, X, HALF],
        lambda t, x, f: t + f * x,
    ),
    _case(
        "accumulate_mixed_precision",
        lambda t, x: vu.accumulate_(t, x, 2.0),
        [T, X.astype(np.float16)],
        lambda t, x: t + 2 * x.astype(F32),
        rtol=1e-3,
    ),
    _case(
        "accumulate_fp16_into_fp16",
        lambda t, x: vu.accumulate_(t, x),
        [T.astype(np.float16), X.astype(np.float16)],
        lambda t, x: (t.astype(F32) + x.astype(F32)).astype(np.float16),
        rtol=1e-3,
        atol=1e-3,
    ),
    _case(
        "accumulate_square_",
        lambda t, x: vu.accumulate_square_(t, x),
        [T, X],
        lambda t, x: t + x * x,
    ),
    _case(
        "accumulate_square_factor",
        lambda t, x: vu.accumulate_square_(t, x, 0.25),
        [T, X],
        lambda t, x: t + 0.25 * x * x,
    ),
    _case(
        "accumulate_mean_",
        lambda t, x: vu.accumulate_mean_(t, x, 3.0),
        [T, X],
        lambda t, x: 3 / 4 * t + 1 / 4 * x,
    ),
    _case(
        "accumulate_mean_tensor_step",
        lambda t, x, s: vu.accumulate_mean_(t, x, s),
        [T, X, STEP],
        lambda t, x, s: s / (s + 1) * t + 1 / (s + 1) * x,
    ),
    _case(
        "accumulate_mean_step0_overwrites",
        lambda t, x: vu.accumulate_mean_(t, x, 0.0),
        [T, X],
        lambda t, x: x,
    ),
    _case(
        "accumulate_moving_average_",
        lambda t, x: vu.accumulate_moving_average_(t, x, 0.9),
        [T, X],
        lambda t, x: 0.9 * t + 0.1 * x,
    ),
    _case(
        "accumulate_moving_average_tensor",
        lambda t, x, f: vu.accumulate_moving_average_(t, x, f),
        [T, X, HALF],
        lambda t, x, f: f * t + (1 - f) * x,
    ),
    _case(
        "accumulate_moving_average_square_",
        lambda t, x: vu.accumulate_moving_average_square_(t, x, 0.99),
        [T, X],
        lambda t, x: 0.99 * t + 0.01 * x * x,
    ),
    _case("accumulator_scale_", lambda t: vu.accumulator_scale_(t, 0.5), [T], lambda t: 0.5 * t),
    _case(
        "accumulator_scale_tensor",
        lambda t, f: vu.accumulator_scale_(t, f),
        [T, HALF],
        lambda t, f: f * t,
    ),
    _case(
        "accumulator_scale_zero_clears_nan",
        lambda t: vu.accumulator_scale_(t, 0.0),
        [np.array([1.0, np.nan, np.inf], F32)],
        lambda t: np.zeros(3),
    ),
    _case("accumulator_zero_", vu.accumulator_zero_, [T], lambda t: np.zeros_like(t)),
    _case("copy_var_update_", vu.copy_var_update_, [T, X], lambda t, x: x),
    _case(
        "copy_var_update_casts",
        vu.copy_var_update_,
        [T, X.astype(np.float16)],
        lambda t, x: x.astype(F32),
    ),
    _case(
        "sparse_accumulate_",
        lambda t, x, i: vu.sparse_accumulate_(t, x, i),
        [f32(5, 3), f32(4, 3, seed=1), np.array([0, 2, 2, 4], np.int32)],
        lambda t, x, i: _sparse_ref(t, x, i, 0, 1.0),
    ),
    _case(
        "sparse_accumulate_axis1_factor",
        lambda t, x, i: vu.sparse_accumulate_(t, x, i, axis=1, f=-0.5),
        [f32(2, 5), f32(2, 2, 2, seed=2), np.array([[1, 3], [3, 0]], np.int32)],
        lambda t, x, i: _sparse_ref(t, x, i, 1, -0.5),
    ),
    _case(
        "sparse_accumulate_tensor_factor_and_W",
        lambda t, x, i, f, w: vu.sparse_accumulate_(t, x, i, f=f, W=w),
        [f32(4, 2), f32(3, 2, seed=3), np.array([3, 1, 7], np.uint32), HALF, f32(4, 2, seed=4)],
        lambda t, x, i, f, w: _sparse_ref(t, x, i.astype(np.int64), 0, f),
    ),
    OpCase(
        "adam_updater_no_bias",
        lambda m, v: vu.adam_updater(m, v),
        [M, V],
        lambda m, v: _adam_ref(m, v, 1e-7),
        rtol=1e-5,
        grad=False,
    ),
    OpCase(
        "adam_updater_step_increments",
        _updater_with_step(vu.adam_updater, beta1=0.9, beta2=0.999, epsilon=1e-5),
        [M, V, STEP],
        lambda m, v, s: (_adam_ref(m, v, 1e-5, s, 0.9, 0.999), s + 1),
        rtol=1e-5,
        grad=False,
    ),
    OpCase(
        "adam_updater_weight_decay",
        lambda m, v, w: vu.adam_updater(m, v, weight=w, weight_decay=0.1),
        [M, V, W],
        lambda m, v, w: _adam_ref(m, v, 1e-7, w=w, wd=0.1),
        rtol=1e-5,
        grad=False,
    ),
    OpCase(
        "adam_updater_fp16_moments",
        lambda m, v, w: vu.adam_updater(m, v, weight=w, weight_decay=0.0),
        [M.astype(np.float16), V.astype(np.float16), W],
        lambda m, v, w: _adam_ref(m.astype(F32), v.astype(F32), 1e-7),
        rtol=2e-3,
        atol=1e-3,
        grad=False,
    ),
    OpCase(
        "lamb_updater_tensor_factors",
        _updater_with_step_and_tensors,
        [M, V, W, STEP, np.array(0.01, F32), np.array(0.8, F32), np.array(0.9, F32)],
        lambda m, v, w, s, wd, b1, b2: (_adam_ref(m, v, 1e-4, s, b1, b2, w, wd), s + 1),
        rtol=1e-5,
        grad=False,
    ),
    OpCase(
        "adamax_updater",
        _updater_with_step(vu.adamax_updater, beta1=0.8, epsilon=1e-3),
        [M, V, STEP],
        lambda m, v, s: (_adam_ref(m, v, 1e-3, s, 0.8, mode="adamax"), s + 1),
        rtol=1e-5,
        grad=False,
    ),
    _case(
        "adam_var_update",
        lambda t, x, r1, r2: vu.adam_var_update(t, x, r1, r2, 0.1, 10.0),
        [T, X, R1, R2],
        lambda t, x, r1, r2: t - 0.1 * _lamb_ratio(r1, r2, 10.0) * x,
    ),
    _case(
        "adam_var_update_clipped_norm",
        lambda t, x, r1, r2: vu.adam_var_update(t, x, r1, r2, 0.1, 1.5),
        [T, X, R1, R2],
        lambda t, x, r1, r2: t - 0.1 * (1.5 / 3.0) * x,
    ),
    _case(
        "adam_var_update_zero_norm",
        _adam_var_update_tensors,
        [T, X, np.array(0.0, F32), R2, np.array(0.5, F32), np.array(2.0, F32)],
        lambda t, x, r1, r2, lr, mwn: t - lr * x,
    ),
    _case(
        "adam_var_update_tensor_factors",
        _adam_var_update_tensors,
        [T, X, R1, R2, HALF, np.array(2.5, F32)],
        lambda t, x, r1, r2, lr, mwn: t - lr * _lamb_ratio(r1, r2, mwn) * x,
    ),
]
