"""Host float8 conversions: bit patterns, scaling, NaN and saturation rules."""

import numpy as np
import pytest

import popxl
from popxl.fp8_utils import host_pow2scale_cast_from_fp8, host_pow2scale_cast_to_fp8

F143, F152 = popxl.float8_143, popxl.float8_152
NAN_BYTE = 0x80


def _bits(x):
    return host_pow2scale_cast_to_fp8(*x).view(np.uint8).tolist()


@pytest.mark.parametrize("src_dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize(
    "value, dtype, scale, bits",
    [
        (0.75, F143, 0, 0b0_0111_100),  # 1.5 * 2^(7 - 8)
        (0.75, F143, -2, 0b0_0101_100),
        (0.75, F143, 1, 0b0_1000_100),
        (-0.75, F143, 0, 0b1_0111_100),
        (0.25, F152, 0, 0b0_01110_00),  # 1.0 * 2^(14 - 16)
        (0.25, F152, -3, 0b0_01011_00),
        (0.0, F143, 5, 0),
        (2.0**-10, F143, 0, 0b0_0000_001),  # smallest subnormal
    ],
)
def test_bit_patterns(src_dtype, value, dtype, scale, bits):
    src = np.array([value], src_dtype)
    assert _bits((src, dtype, scale, False)) == [bits]
    assert _bits((src, dtype, scale, True)) == [bits]


@pytest.mark.parametrize("src_dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "value, dtype, saturated",
    [(250.0, F143, 0b0_1111_111), (70000.0, F152, 0b0_11111_11), (-300.0, F143, 0b1_1111_111)],
)
def test_overflow_saturates_or_becomes_nan(src_dtype, value, dtype, saturated):
    src = np.array([value], src_dtype)
    assert _bits((src, dtype, 0, False)) == [saturated]
    assert _bits((src, dtype, 0, True)) == [NAN_BYTE]


@pytest.mark.parametrize("nan_on_overflow", [False, True])
@pytest.mark.parametrize("dtype", [F143, F152])
def test_nan_and_infinity_always_become_nan(dtype, nan_on_overflow):
    # 70000 overflows float16 to infinity before the conversion: it is NaN, not saturated.
    with np.errstate(over="ignore"):
        src = np.array([np.nan, np.inf, -np.inf, 70000.0], np.float32).astype(np.float16)
    assert _bits((src, dtype, 0, nan_on_overflow)) == [NAN_BYTE] * 4


def test_scaling_overflow_of_a_finite_value_saturates():
    src = np.array([1.0, 3.0], np.float32)
    assert _bits((src, F143, 8, False)) == [0b0_1111_111] * 2  # 256 and 768 > 240
    assert _bits((src, F143, 7, True)) == [0b0_1111_000, NAN_BYTE]  # 128 fits, 384 does not


@pytest.mark.parametrize("dtype", [F143, F152])
@pytest.mark.parametrize("scale", [-3, 0, 2])
def test_round_trip_of_every_finite_byte(dtype, scale):
    every = np.arange(256, dtype=np.uint8).view(dtype.as_numpy())
    values = host_pow2scale_cast_from_fp8(every, popxl.float64, -scale)
    again = host_pow2scale_cast_to_fp8(values, dtype, scale, False)
    finite = np.arange(256) != NAN_BYTE
    np.testing.assert_array_equal(again.view(np.uint8)[finite], np.arange(256)[finite])
    assert np.isnan(values[NAN_BYTE])
