"""Rounding a float32 value to a narrower float format, kept in float32, on every backend.

The natural spelling, ``x.astype(float16).astype(float32)``, is not reliable: XLA's GPU
compiler allows *excess precision* and folds such a pair of casts away, so a value meant to
be rounded to float16 keeps all of its float32 bits. PopXL programs depend on those
roundings (a float16 optimizer state rounds after every operation, as the IPU computed it;
stochastic rounding compares a value with its nearest float16). ``round_to`` rounds with
integer and exact power-of-two arithmetic instead, which no compiler may fold, and gives the
bits of the IEEE cast: round to nearest, ties to even, float16 subnormals, overflow to
infinity, NaN and infinities unchanged.

>>> import numpy as np
>>> x = np.array([1 + 2**-11, 1 + 3 * 2**-11, 65520.0, 2**-25 * 3, np.nan], np.float32)
>>> round_to(x, np.float16).tolist()[:4]
[1.0, 1.001953125, inf, 1.1920928955078125e-07]
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ._base import jnp, lax

# Per format: float32 mantissa bits dropped, and for formats whose exponent range is
# narrower than float32's, the smallest normal exponent and the largest finite value.
_FORMATS: dict[Any, tuple[int, int | None, float | None]] = {
    np.dtype(np.float16): (13, -14, 65504.0),
    np.dtype(ml_dtypes.bfloat16): (16, None, None),
}


def round_to(x: Any, dtype: Any) -> Any:
    """Float32 ``x`` rounded to ``dtype``'s values, as float32.

    Formats other than float16 and bfloat16 fall back to a round trip of casts.
    """
    fmt = _FORMATS.get(np.dtype(dtype))
    x = jnp.asarray(x, jnp.float32)
    if fmt is None:
        return x.astype(dtype).astype(jnp.float32)
    drop, min_exponent, largest = fmt
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    # Round to nearest even on the kept bits: add half a unit less one, plus the kept lsb.
    lsb = (bits >> drop) & np.uint32(1)
    bits = (bits + np.uint32((1 << (drop - 1)) - 1) + lsb) & np.uint32(
        ~((1 << drop) - 1) & 0xFFFFFFFF
    )
    rounded = lax.bitcast_convert_type(bits, jnp.float32)
    if min_exponent is not None:
        # Below the smallest normal the spacing is fixed (2**-24 for float16).
        quantum = 2.0 ** (min_exponent - (23 - drop))
        small = jnp.round(x * np.float32(1 / quantum)) * np.float32(quantum)
        rounded = jnp.where(jnp.abs(x) < np.float32(2.0**min_exponent), small, rounded)
        overflow = jnp.abs(rounded) > np.float32(largest)
        rounded = jnp.where(overflow, jnp.copysign(np.float32(np.inf), x), rounded)
    return jnp.where(jnp.isfinite(x), rounded, x)
