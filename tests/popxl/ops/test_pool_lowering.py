"""How pools lower: window maxima and sums (tiled windows as a reshape, overlapping ones as
maxima and sums of the taps' slices) give ``reduce_window``'s values, a max sends each
window's gradient to its first maximum as torch does (ties are common after a ReLU), and
neither gradient uses ``select_and_scatter``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax import lax

from runtime.backend import pool_forms
from runtime.backend.forms import forms_of
from runtime.backend.pool_forms import window_max, window_sum

# (input shape, kernel, stride, dilation); inputs are already padded, windows VALID.
CASES = [
    ((2, 3, 8, 8), (2, 2), (2, 2), (1, 1)),  # tiled
    ((2, 3, 9, 7), (2, 2), (2, 2), (1, 1)),  # tiled, trailing elements no window reaches
    ((2, 3, 9, 9), (3, 3), (2, 2), (1, 1)),  # overlapping (ResNet's stem pool)
    ((1, 2, 8, 8), (3, 3), (1, 1), (1, 1)),
    ((1, 2, 9, 10), (2, 3), (3, 2), (2, 1)),  # dilated, gaps between windows
    ((2, 3, 10), (3,), (2,), (1,)),
    ((1, 2, 4, 6, 6), (2, 2, 2), (2, 2, 2), (1, 1, 1)),
    ((1, 2, 5, 6, 7), (3, 2, 3), (2, 1, 2), (1, 2, 1)),
]
IDS = ["tiled", "tiled_cropped", "overlap_s2", "overlap_s1", "dilated", "1d", "3d_tiled", "3d"]


def _reduce_window(x, fill, op, kernel, stride, dilation):
    ones = (1, 1)
    return lax.reduce_window(
        x, fill, op, ones + kernel, ones + stride, "VALID", None, ones + dilation
    )


def _tied(rng, shape):
    """ReLU'd values on a coarse grid: many windows hold equal maxima (often zeros)."""
    return np.maximum(np.round(rng.standard_normal(shape) * 2) / 2, 0).astype(np.float32)


def _torch_max_pool_grad(x, gy, kernel, stride, dilation):
    pool = getattr(torch.nn.functional, f"max_pool{len(kernel)}d")
    tx = torch.tensor(x, requires_grad=True)
    pool(tx, kernel, stride, 0, dilation).backward(torch.tensor(np.asarray(gy)))
    return tx.grad.numpy()


def _value_and_pullback(f, x, gy):
    y, pullback = jax.vjp(f, x)
    return y, pullback(gy)[0]


@pytest.mark.parametrize("shape,kernel,stride,dilation", CASES, ids=IDS)
def test_max_values_and_first_maximum_gradient_match_torch(rng, shape, kernel, stride, dilation):
    x = _tied(rng, shape)
    pooled = lambda a: window_max(a, kernel, stride, dilation)  # noqa: E731
    y_shape = jax.eval_shape(pooled, jnp.asarray(x)).shape
    gy = rng.standard_normal(y_shape).astype(np.float32)
    # Under jit, as programs run it (op by op, each of its small ops compiled on its own)
    y, dx = jax.jit(lambda a, g: _value_and_pullback(pooled, a, g))(x, gy)
    np.testing.assert_array_equal(y, _reduce_window(x, -np.inf, lax.max, kernel, stride, dilation))
    want = _torch_max_pool_grad(x, gy, kernel, stride, dilation)
    np.testing.assert_allclose(dx, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape,kernel,stride,dilation", CASES, ids=IDS)
def test_sum_values_and_gradient_match_reduce_window(rng, shape, kernel, stride, dilation):
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    summed = lambda a: window_sum(a, kernel, stride, dilation)  # noqa: E731
    reference = lambda a: _reduce_window(a, 0.0, lax.add, kernel, stride, dilation)  # noqa: E731
    gy = jnp.asarray(rng.standard_normal(jax.eval_shape(summed, x).shape), jnp.float32)

    @jax.jit
    def both(a, g):
        return _value_and_pullback(summed, a, g), _value_and_pullback(reference, a, g)

    for got, want in zip(*both(x, gy)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_max_of_integers_has_no_gradient_rule_to_trip_on():
    x = jnp.arange(2 * 16, dtype=jnp.int32).reshape(1, 2, 4, 4)
    y = window_max(x, (2, 2), (2, 2), (1, 1))
    assert y.dtype == jnp.int32
    np.testing.assert_array_equal(y[0, 0], [[5, 7], [13, 15]])


def test_a_nan_takes_its_window_gradient():
    x = np.zeros((1, 1, 2, 2), np.float32)
    x[0, 0, 1, 0] = np.nan
    y, pullback = jax.vjp(lambda a: window_max(a, (2, 2), (2, 2), (1, 1)), jnp.asarray(x))
    assert np.isnan(y).all()
    np.testing.assert_array_equal(pullback(jnp.ones_like(y))[0][0, 0], [[0, 0], [1, 0]])


@pytest.mark.parametrize("shape,kernel,stride,dilation", CASES[:3], ids=IDS[:3])
def test_max_pool_gradient_has_no_select_and_scatter(shape, kernel, stride, dilation):
    x = jnp.zeros(shape, jnp.float32)
    grad = jax.grad(lambda a: jnp.sum(window_max(a, kernel, stride, dilation) ** 2))
    hlo = jax.jit(grad).lower(x).as_text()
    assert "select_and_scatter" not in hlo and "reduce_window" not in hlo


@pytest.mark.parametrize("case", [0, 6], ids=[IDS[0], IDS[6]])
@pytest.mark.parametrize("dtype,guards", [(jnp.float16, 1), (jnp.float32, 0)])
def test_tiled_max_gradient_computes_each_half_precision_windows_winner_once(case, dtype, guards):
    # Each window's winner is read by every element of the window: in half precision it is
    # computed into a buffer first, or XLA:CPU would evaluate it, and the conversions that
    # produced the pool's input, once per element; in float32 the compares are cheaper.
    shape, kernel, stride, dilation = CASES[case]
    x = jnp.zeros(shape, dtype)
    grad = jax.grad(lambda a: jnp.sum(window_max(a, kernel, stride, dilation).astype(jnp.float32)))
    eqns = jax.make_jaxpr(grad)(x).jaxpr.eqns
    found = [e for e in eqns if e.primitive.name == "reduce" and e.params["jaxpr"]]
    assert len(found) == guards  # the OR of runtime.backend.xla_workarounds.computed_once


@pytest.mark.parametrize(
    "shape,kernel,stride,dilation", CASES[2:5] + CASES[7:], ids=IDS[2:5] + IDS[7:]
)
def test_overlapping_max_gradient_is_one_scatter_add_of_the_windows(
    shape, kernel, stride, dilation
):
    # One update per window and channel at its winner: no stacked taps, no argmax, no
    # per-tap shifted sums (S3D's 3x3x3 pools took 215 ms each that way).
    x = jnp.zeros(shape, jnp.float32)
    grad = jax.grad(lambda a: jnp.sum(window_max(a, kernel, stride, dilation) ** 2))
    jaxpr = jax.make_jaxpr(grad)(x)
    names = [e.primitive.name for e in jaxpr.jaxpr.eqns]
    assert names.count("scatter-add") == 1
    assert "argmax" not in names and "concatenate" not in names


def test_overlapping_max_gradient_sums_windows_sharing_a_winner():
    # A stride-1 3x3 pool over one peak: every window holding it sends its gradient there.
    x = np.zeros((1, 1, 5, 5), np.float32)
    x[0, 0, 2, 2] = 1.0
    y, pullback = jax.vjp(lambda a: window_max(a, (3, 3), (1, 1), (1, 1)), jnp.asarray(x))
    np.testing.assert_array_equal(y, np.ones((1, 1, 3, 3), np.float32))
    gy = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
    (dx,) = pullback(jnp.asarray(gy))
    want = np.zeros_like(x)
    want[0, 0, 2, 2] = gy.sum()
    np.testing.assert_array_equal(dx, want)


def test_overlapping_max_gradient_indexes_per_sample_past_int32(rng, monkeypatch):
    # Flat indices into an input of 2**31 elements or more would overflow int32: such inputs
    # are indexed (sample, position within it), with the same result.
    shape, kernel, stride, dilation = CASES[7]
    x = jnp.asarray(_tied(rng, shape))
    y, pullback = jax.vjp(lambda a: window_max(a, kernel, stride, dilation), x)
    gy = jnp.asarray(rng.standard_normal(y.shape).astype(np.float32))
    flat = pullback(gy)[0]
    monkeypatch.setattr(pool_forms, "_INDEX_LIMIT", 8)
    _, per_sample = jax.vjp(lambda a: window_max(a, kernel, stride, dilation), x)
    np.testing.assert_array_equal(per_sample(gy)[0], flat)


def test_other_backends_keep_reduce_window_for_sums_and_differentiate_it(rng):
    x = jnp.asarray(_tied(rng, (2, 3, 9, 9)))
    with forms_of("gpu"):
        step = jax.jit(jax.grad(lambda a: window_sum(a, (3, 3), (2, 2), (1, 1)).sum()))
        hlo = step.lower(x).as_text()
        summed, pullback = jax.vjp(lambda a: window_sum(a, (2, 2), (2, 2), (1, 1)), x)
    assert "reduce_window" in hlo
    np.testing.assert_array_equal(summed, _reduce_window(x, 0.0, lax.add, (2, 2), (2, 2), (1, 1)))
    covered = np.ones(x.shape, np.float32)
    covered[..., 8, :] = covered[..., :, 8] = 0  # the 2x2 windows leave the last row and column
    np.testing.assert_array_equal(pullback(jnp.ones_like(summed))[0], covered)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_max_takes_torchs_winner_and_nan_rule_on_every_backend(rng, backend):
    # select_and_scatter sends a NaN window's gradient elsewhere, and JAX cannot transpose
    # a dilated max reduce_window: the strided-slice form serves every backend.
    x = _tied(rng, (2, 3, 9, 9))
    x[0, 0, 0, 1] = np.nan
    gy = rng.standard_normal((2, 3, 3, 4)).astype(np.float32)
    with forms_of(backend):
        y, pullback = jax.vjp(lambda a: window_max(a, (3, 2), (2, 2), (2, 1)), jnp.asarray(x))
        (gx,) = pullback(jnp.asarray(gy))
    np.testing.assert_array_equal(gx, _torch_max_pool_grad(x, gy, (3, 2), (2, 2), (2, 1)))


def test_the_cpu_forms_can_be_chosen_on_any_backend(rng):
    x = jnp.asarray(_tied(rng, (2, 3, 9, 9)))
    with forms_of("cpu"):
        hlo = jax.jit(jax.grad(lambda a: window_max(a, (3, 3), (2, 2), (1, 1)).sum())).lower(x)
    assert "select-and-scatter" not in hlo.as_text(dialect="hlo")
    assert "reduce_window" not in hlo.as_text()


@pytest.mark.parametrize("pool", ["max", "average"])
def test_a_window_wider_than_its_input_reads_only_the_input(rng, pool):
    # EfficientNet's final AvgPool2d(hidden_dim, ceil_mode=True): a 2560-wide window over a
    # 2x2 map, whose taps past the map read only padding. The lowering pads to the map's
    # extent, not the kernel's (which took minutes and gigabytes to trace).
    from popxl.ops.pool import _lower_average_pool, _lower_max_pool

    attrs = dict(
        kernel_size=(2560, 2560),
        stride=(2560, 2560),
        padding=(0,) * 4,
        out_pads=(0,) * 4,
        dilation=(1, 1),
        in_dilations=(1, 1),
        auto_pad="not_set",
        ceil_mode=True,
    )
    x = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
    lower = _lower_max_pool if pool == "max" else _lower_average_pool
    extra = {"storage_order": "row"} if pool == "max" else {}
    pooled = lambda a: lower(a, **extra, **attrs)  # noqa: E731
    for f in (pooled, jax.grad(lambda a: pooled(a).sum())):
        jaxpr = jax.make_jaxpr(f)(x)
        assert max(v.aval.size for e in jaxpr.jaxpr.eqns for v in e.outvars) <= x.size
    reduce = np.max if pool == "max" else np.mean
    np.testing.assert_allclose(
        lower(jnp.asarray(x), **extra, **attrs), reduce(x, (2, 3), keepdims=True), rtol=1e-6
    )
