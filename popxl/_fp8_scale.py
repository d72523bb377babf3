"""Choosing a float8 scaling bias by the mean squared error of the cast (MSE metric).

A value ``x`` cast to float8 with scaling bias ``b`` is stored as ``x * 2**b``. For each
candidate ``b`` the error of the cast is estimated from a histogram of the source's binary
exponents (bin ``i`` holds ``|x|`` in ``[2**(i-126), 2**(i-125))``):

* bins below the format's range after scaling underflow to zero: error ``lower_edge**2``;
* bins inside it lose mantissa bits: error ``lower_edge**2 * 2**(-2 * lost_bits)``;
* bins above it saturate at the largest in-range edge: error ``(top - lower_edge)**2``.

The bias with the smallest total error wins; among equal errors, the middle one (in
increasing order). The cost is ``table @ histogram`` with one table row per candidate, so
the host function here and the device op (``popxl_addons.ops.fp8_mse_scale``) share it.
"""

from __future__ import annotations

from functools import cache

import numpy as np

MIN_SCALING_BIAS, MAX_SCALING_BIAS = -31, 31
SRC_MIN_EXP, SRC_MAX_EXP = -126, 127  # float32 without denormals (also used for float16)
BINS = SRC_MAX_EXP - SRC_MIN_EXP  # histogram bins above the underflow bin
# float8 format -> (smallest exponent with denormals, largest exponent, mantissa bits)
FORMATS = {"float8_143": (-10, 7, 3), "float8_152": (-17, 15, 2)}
SOURCE_MANTISSA = {"float32": 23, "float16": 10}


@cache
def cost_factors(source: str, dest: str) -> np.ndarray:
    """``(candidates, BINS)``: the error weight of each bin per bias, divided by the square
    of the bin's lower edge (so every entry is at most 1; the weights themselves span
    ``2**-252 .. 2**252``, beyond float32).

    Row ``k`` is the scaling bias ``MIN_SCALING_BIAS + k``; see the module docstring.
    """
    min_exp, max_exp, mantissa = FORMATS[dest]
    span = max_exp - min_exp + 1
    quantisation = 2.0 ** (-2.0 * (SOURCE_MANTISSA[source] - mantissa))
    first = min_exp + MIN_SCALING_BIAS - SRC_MIN_EXP
    last = min(min_exp + MAX_SCALING_BIAS - SRC_MIN_EXP, BINS)
    index = np.arange(BINS)
    rows = []
    for start in range(first, last + 1):
        top = min(start + span, BINS) - 1
        row = np.where(index < start, 1.0, quantisation)
        saturated = (2.0 ** (top - index.astype(np.float64)) - 1.0) ** 2
        rows.append(np.where(index >= start + span, saturated, row))
    return np.stack(rows)


def edges_squared(relative_to: int = SRC_MIN_EXP) -> np.ndarray:
    """``(2**(i + SRC_MIN_EXP) / 2**relative_to)**2`` for each bin ``i``."""
    return 4.0 ** (np.arange(BINS) + SRC_MIN_EXP - relative_to)


def exponent_bins(magnitude: np.ndarray) -> np.ndarray:
    """Histogram bin of each ``|x|``: 0 below ``2**-126`` (zeros included), then one bin
    per binary exponent, the last one also holding everything above ``2**126``."""
    _, exponent = np.frexp(magnitude)
    bins = np.clip(exponent - SRC_MIN_EXP, 0, BINS)
    return np.where(magnitude < 2.0**SRC_MIN_EXP, 0, bins)


def middle_of_best(costs: np.ndarray) -> int:
    """Index of the middle one (in increasing order) of the smallest costs."""
    best = np.flatnonzero(costs == costs.min())
    return int(best[len(best) // 2])


def host_mse_scale(src: np.ndarray, dest: str) -> tuple[float, int]:
    """``(metric, scale)``: the smallest estimated error and ``-bias`` (PopART's sign)."""
    source = "float32" if src.dtype == np.float32 else "float16"
    magnitude = np.abs(src.reshape(-1).astype(np.float64))
    hist = np.bincount(exponent_bins(magnitude), minlength=BINS + 1) / magnitude.size
    costs = cost_factors(source, dest) @ (edges_squared(0) * hist[1:])
    k = middle_of_best(costs)
    return float(costs[k]), -(MIN_SCALING_BIAS + k)
