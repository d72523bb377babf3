"""``runtime.xla_workarounds``: the guards give the numbers eager JAX gives."""

import jax
import numpy as np
from jax import lax

from runtime.xla_workarounds import fenced


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
