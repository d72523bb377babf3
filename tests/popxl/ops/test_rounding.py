"""Rounding float32 to narrower formats without casts a compiler may fold, and the
precision of float32 products."""

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from popxl.ops._base import dot_precision
from popxl.ops._rounding import round_to

EDGES = [
    0.0, -0.0, np.inf, -np.inf, np.nan,
    1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11),  # float16 ties: to even
    1 + 2**-8, 1 + 3 * 2**-8,  # bfloat16 ties
    65504.0, 65519.99, 65520.0, -65520.0, 1e38,  # float16 largest, overflow
    2**-14, 2**-14 - 2**-25, 2**-24, 1.5 * 2**-24, 2.5 * 2**-24, 2**-25, 2**-26, 6e-8,
]  # fmt: skip


def _values() -> np.ndarray:
    rng = np.random.default_rng(0)
    scales = [1.0, 1e-3, 1e-5, 1e-7, 3e4, 1e30]
    random = [rng.normal(0, s, 20000) for s in scales]
    return np.concatenate([*random, EDGES]).astype(np.float32)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_round_to_gives_the_bits_of_the_cast(dtype):
    x = _values()
    with np.errstate(over="ignore"):
        want = x.astype(dtype).astype(np.float32)
    got = np.asarray(jax.jit(lambda a: round_to(a, dtype))(x))
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), (x[~same][:5], got[~same][:5], want[~same][:5])


def test_round_to_hand_values():
    x = np.array([1 + 2**-11, 1 + 3 * 2**-11, 65520.0, 3 * 2**-25, -(2**-26)], np.float32)
    got = np.asarray(round_to(x, np.float16))
    np.testing.assert_array_equal(got, [1.0, 1 + 2**-9, np.inf, 2**-23, -0.0])
    assert np.signbit(got[-1])


def test_round_to_other_formats_casts():
    x = np.array([1.3, -2.7], np.float32)
    np.testing.assert_array_equal(round_to(x, np.float32), x)


def test_float32_products_are_ieee_unless_the_user_chose_a_precision():
    assert dot_precision(np.float32) == lax.Precision.HIGHEST
    assert dot_precision(np.float16) is None
    with jax.default_matmul_precision("tensorfloat32"):
        assert dot_precision(np.float32) is None


def test_a_chosen_precision_is_a_different_compiled_step():
    """The step cache keys on the matmul precision, so a program built under
    ``jax.default_matmul_precision`` is lowered with it rather than taken from the cache."""
    import popxl
    from runtime.session.program import build_program

    def program():
        ir = popxl.Ir()
        with ir.main_graph:
            w = popxl.variable(np.ones((4, 4), np.float32))
            popxl.ops.host_store(popxl.d2h_stream((4, 4), popxl.float32), w @ w)
        return build_program(ir)

    default = program().key
    assert program().key == default
    with jax.default_matmul_precision("tensorfloat32"):
        assert program().key != default
