"""enableStochasticRounding: float32 -> float16 casts round up with probability equal to the
distance from the lower neighbour, so the rounding is unbiased on average."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops

ULP_AT_1 = 2.0**-10  # float16 spacing in [1, 2)


def _cast(x, stochastic=True):
    ir = popxl.Ir()
    ir._pb_ir.getSessionOptions().enableStochasticRounding = stochastic
    with ir.main_graph:
        h2d = popxl.h2d_stream(x.shape, popxl.float32, "x")
        d2h = popxl.d2h_stream(x.shape, popxl.float16, "y")
        ops.host_store(d2h, ops.cast(ops.host_load(h2d), popxl.float16))
    with popxl.Session(ir, "cpu") as session:
        return session.run({h2d: x})[d2h]


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.9])
def test_rounds_up_with_the_right_probability(fraction):
    n = 40_000
    x = np.full(n, 1 + fraction * ULP_AT_1, np.float32)
    y = _cast(x)
    assert set(np.unique(y).tolist()) == {1.0, 1 + ULP_AT_1}
    p_up = np.mean(y == np.float16(1 + ULP_AT_1))
    # 5 standard deviations of a binomial proportion
    assert abs(p_up - fraction) < 5 * np.sqrt(fraction * (1 - fraction) / n)


def test_unbiased_where_nearest_rounding_is_biased():
    x = np.full(40_000, 1 + 0.25 * ULP_AT_1, np.float32)
    nearest_bias = np.mean(_cast(x, stochastic=False).astype(np.float64) - x)
    stochastic_bias = np.mean(_cast(x).astype(np.float64) - x)
    assert nearest_bias == pytest.approx(-0.25 * ULP_AT_1)
    assert abs(stochastic_bias) < 0.02 * ULP_AT_1


def test_exact_and_special_values_unchanged_and_runs_repeat():
    x = np.array([1.0, -2.5, 0.0, np.inf, -np.inf, 65504.0, 1e6], np.float32)
    y = _cast(x)
    expected = np.array([1.0, -2.5, 0.0, np.inf, -np.inf, 65504.0, np.inf], np.float16)
    np.testing.assert_array_equal(y, expected)  # 1e6 overflows to inf, as nearest rounding does
    assert np.isnan(_cast(np.array([np.nan], np.float32))[0])
    r = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    np.testing.assert_array_equal(_cast(r), _cast(r))
    lo = np.nextafter(r.astype(np.float16), np.float16(-np.inf))
    hi = np.nextafter(r.astype(np.float16), np.float16(np.inf))
    assert np.all((_cast(r) >= lo) & (_cast(r) <= hi))


def test_off_by_default_is_nearest_rounding():
    x = np.full(100, 1 + 0.75 * ULP_AT_1, np.float32)
    np.testing.assert_array_equal(_cast(x, stochastic=False), np.float16(1 + ULP_AT_1))
    assert not popxl.Ir()._pb_ir.getSessionOptions().enableStochasticRounding
