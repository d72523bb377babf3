"""How the norms lower: a one-group norm of 2-D rows (``ops.layer_norm``, and the
``native_layer_norm`` of captured torch models) computes its statistics on the rows
themselves, without a unit group axis: XLA then keeps a residual sum feeding the norm
materialised once, instead of recomputing it in each statistic's fusion and copying a
scanned layer's carry."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from popxl.ops.norm import _lower_group_norm


def _shapes(x: jax.Array, groups: int) -> set[tuple[int, ...]]:
    w, b = jnp.ones(x.shape[1]), jnp.zeros(x.shape[1])
    jaxpr = jax.make_jaxpr(lambda a: _lower_group_norm(a, w, b, num_groups=groups, eps=1e-5))(x)
    return {tuple(v.aval.shape) for eqn in jaxpr.jaxpr.eqns for v in eqn.outvars}


def test_one_group_over_rows_adds_no_group_axis():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((6, 8)), jnp.float32)
    assert (6, 1, 8) not in _shapes(x, 1)
    assert (6, 2, 4) in _shapes(x, 2)  # several groups still split the channels


def test_one_group_values_equal_the_row_statistics():
    x = np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32)
    w = np.linspace(0.5, 2.0, 7).astype(np.float32)
    b = np.linspace(-1.0, 1.0, 7).astype(np.float32)
    y, mean, inv_std = _lower_group_norm(jnp.asarray(x), w, b, num_groups=1, eps=1e-5)
    m = x.mean(1, keepdims=True)
    s = 1 / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, (x - m) * s * w + b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean, m.ravel(), rtol=1e-6)
    np.testing.assert_allclose(inv_std, s.ravel(), rtol=1e-5)
