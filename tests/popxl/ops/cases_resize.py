"""Op-table cases: grid sampling (``ops.grid_sample``).

The NumPy reference samples one output point at a time in float64, as torch's CPU kernel
writes it: unnormalise the point, apply the padding mode, then read the neighbouring
pixels (out of range: 0).
"""

import itertools
import math

import numpy as np

import popxl.ops as ops

from .harness import OpCase, f32


def _unnormalize(g, size, align_corners):
    return (g + 1) / 2 * (size - 1) if align_corners else ((g + 1) * size - 1) / 2


def _reflect(c, twice_low, twice_high):
    if twice_low == twice_high:
        return 0.0
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    d = abs(c - low)
    extra, flips = math.fmod(d, span), math.floor(d / span)
    return extra + low if flips % 2 == 0 else span - extra + low


def _padded(c, size, padding_mode, align_corners):
    if padding_mode == "reflection":
        twice = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        c = _reflect(c, *twice)
    if padding_mode in ("border", "reflection"):
        c = min(max(c, 0.0), size - 1.0)
    return c


def _read(img, index):
    """``img[:, *index]``, 0 outside."""
    if all(0 <= i < s for i, s in zip(index, img.shape[1:])):
        return img[(slice(None), *index)]
    return np.zeros(img.shape[0])


def _cubic(t, a=-0.75):
    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _sample(img, point, mode, padding_mode, align_corners):
    """One output point: ``point`` is x first, ``img`` ``(C, *spatial)``."""
    sizes = img.shape[1:]
    coords = [_unnormalize(g, s, align_corners) for g, s in zip(point[::-1], sizes)]
    if mode == "nearest":
        padded = [_padded(c, s, padding_mode, align_corners) for c, s in zip(coords, sizes)]
        return _read(img, [int(round(c)) for c in padded])  # round: half to even, as torch
    if mode == "bilinear":
        coords = [_padded(c, s, padding_mode, align_corners) for c, s in zip(coords, sizes)]
        lows = [math.floor(c) for c in coords]
        acc = np.zeros(img.shape[0])
        for bits in itertools.product((0, 1), repeat=len(sizes)):
            w = np.prod([c - lo if b else lo + 1 - c for c, lo, b in zip(coords, lows, bits)])
            acc += w * _read(img, [lo + b for lo, b in zip(lows, bits)])
        return acc
    lows = [math.floor(c) for c in coords]
    weights = [_cubic(c - lo) for c, lo in zip(coords, lows)]
    acc = np.zeros(img.shape[0])
    for taps in itertools.product(range(4), repeat=len(sizes)):
        w = np.prod([ws[t] for ws, t in zip(weights, taps)])
        index = [
            int(_padded(lo + t - 1, s, padding_mode, align_corners))
            for lo, t, s in zip(lows, taps, sizes)
        ]
        acc += w * _read(img, index)
    return acc


def _grid_sample_ref(x, grid, mode, padding_mode, align_corners):
    x64, g64 = x.astype(np.float64), grid.astype(np.float64)
    out = np.zeros((*x.shape[:2], *grid.shape[1:-1]))
    for n in range(x.shape[0]):
        for pos in np.ndindex(*grid.shape[1:-1]):
            value = _sample(x64[n], g64[(n, *pos)], mode, padding_mode, align_corners)
            out[(n, slice(None), *pos)] = value
    return out.astype(x.dtype)


X2 = f32(2, 2, 4, 5, seed=80)
X3 = f32(1, 2, 3, 4, 3, seed=81)
# Points inside and up to 1.5 widths outside [-1, 1], so every padding mode matters.
GRID2 = f32(2, 3, 2, 2, seed=82, low=-1.6, high=1.6)
GRID3 = f32(1, 2, 3, 2, 3, seed=83, low=-1.6, high=1.6)


def _case(x, grid, mode, padding_mode, align_corners):
    corners = "_align_corners" if align_corners else ""
    name = f"grid_sample_{x.ndim - 2}d_{mode}_{padding_mode}{corners}"
    return OpCase(
        name,
        lambda t, g: ops.grid_sample(t, g, mode, padding_mode, align_corners),
        [x, grid],
        lambda a, b: _grid_sample_ref(a, b, mode, padding_mode, align_corners),
        atol=1e-5,
        # The nearest pixel is a step function of the grid: no gradient to check there.
        grad=[0] if mode == "nearest" else True,
    )


CASES = [
    _case(X2, GRID2, "bilinear", "zeros", False),
    _case(X2, GRID2, "bilinear", "border", True),
    _case(X2, GRID2, "bilinear", "reflection", False),
    _case(X2, GRID2, "bilinear", "reflection", True),
    _case(X2, GRID2, "nearest", "zeros", True),
    _case(X2, GRID2, "nearest", "reflection", False),
    _case(X2, GRID2, "bicubic", "zeros", False),
    _case(X2, GRID2, "bicubic", "border", False),
    _case(X2, GRID2, "bicubic", "reflection", True),
    _case(X3, GRID3, "bilinear", "zeros", True),
    _case(X3, GRID3, "nearest", "border", False),
]
