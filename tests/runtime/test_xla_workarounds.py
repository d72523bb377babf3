"""``runtime.backend.xla_workarounds``: the guards give the numbers eager JAX gives, and keep XLA
from repeating work."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from runtime.backend.xla_workarounds import computed_once, fenced


def _shift_down(x, fence):
    """Row k+1 of ``base`` becomes row k, then a reshape: the pattern of openxla/xla#49176."""
    base = x + np.int32(1)
    written = lax.dynamic_update_slice(base, base[:3], (1, 0, 0))
    return (fenced(written) if fence else written).reshape((1, 4, 1))


def test_a_fenced_in_place_write_followed_by_a_reshape_matches_eager():
    x = np.arange(4, dtype=np.int32).reshape(4, 1, 1)
    with jax.disable_jit():
        eager = np.asarray(_shift_down(x, fence=False))
    np.testing.assert_array_equal(eager.ravel(), [1, 1, 2, 3])
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: _shift_down(v, True))(x)), eager)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, jnp.bfloat16, np.int32, np.bool_])
def test_computed_once_is_the_value_bit_for_bit(dtype):
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3.5, 65504.0]
    if np.dtype(dtype).kind == "f" or dtype is jnp.bfloat16:
        x = np.array(special, np.float32).astype(dtype).reshape(2, 4)
        as_bits = lambda a: np.asarray(a).view(f"u{np.dtype(dtype).itemsize}")  # noqa: E731
    else:
        x = np.array([0, 1, -7, 2**31 - 1, 0, 1, 1, 0]).astype(dtype).reshape(2, 4)
        as_bits = np.asarray
    got = jax.jit(computed_once)(x)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(as_bits(got), as_bits(x))


def _spread(x, once):
    """25 shifted sums of ``x``, each element then read by four outputs (a 2x2 upsample)."""
    total = sum(x[i : i + 60, j : j + 60] for i in range(5) for j in range(5))
    total = computed_once(total) if once else total
    return jnp.repeat(jnp.repeat(total, 2, axis=0), 2, axis=1)


def test_computed_once_keeps_a_value_out_of_consumers_that_read_it_repeatedly():
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    fused = jax.jit(lambda v: _spread(v, False)).lower(x).compile().as_text()
    once = jax.jit(lambda v: _spread(v, True)).lower(x).compile().as_text()
    # Unguarded, the sums sit in the upsampling's loop (one fusion, evaluated per output);
    # guarded, they are a reduction's input, in a fusion of their own.
    assert fused.count("fusion(") == 1 and "reduce(" not in fused
    assert "reduce(" in once and once.count("fusion(") == 2
    np.testing.assert_array_equal(
        np.asarray(jax.jit(lambda v: _spread(v, True))(x)),
        np.asarray(jax.jit(lambda v: _spread(v, False))(x)),
    )
