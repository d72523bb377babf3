"""Stochastic rounding of float32 → float16 casts (``enableStochasticRounding``).

The IPU rounded stochastically in hardware: a value between two representable neighbours
``lo < x < hi`` becomes ``hi`` with probability ``(x - lo) / (hi - lo)`` and ``lo``
otherwise, so the rounding is unbiased on average (sums of many small updates in float16 do
not vanish as they do with round-to-nearest). Here the casts an IR records with
``ops.cast`` round that way when the session options enable it.

The random numbers are deterministic: a hash of each element's bits, its position and the
op's id. A program therefore gives the same numbers on every run with the same inputs,
while different values and positions draw independent-looking numbers. Values that are
exactly representable, infinities and NaNs are unchanged; values beyond the target's range
round as the ordinary cast does.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from popxl._op import Op
from popxl.dtypes import float16, float32

from .core import Env, apply_results, rounded_cast

TARGETS = (float16,)
_GOLDEN = np.uint32(0x9E3779B9)


def applies(op: Op) -> bool:
    """Whether ``op`` is a cast that rounds stochastically when enabled."""
    return (
        op.opdef.key == "cast"
        and op.inputs[0].dtype == float32
        and op.attrs["data_type"] in TARGETS
    )


def _mix(h: Any) -> Any:
    """A 32-bit integer hash (lowbias32): every input bit affects every output bit."""
    h = h ^ (h >> 16)
    h = h * np.uint32(0x7FEB352D)
    h = h ^ (h >> 15)
    h = h * np.uint32(0x846CA68B)
    return h ^ (h >> 16)


def _hash(bits: Any, seed: int) -> Any:
    """32 random-looking bits per element, from the element's ``bits``, position and ``seed``."""
    index = jnp.arange(bits.size, dtype=jnp.uint32).reshape(bits.shape)
    salt = np.uint32((seed * int(_GOLDEN)) % (1 << 32))
    return _mix(bits ^ _mix(index * _GOLDEN + salt))


def stochastic_round(x: Any, target: Any, seed: int) -> Any:
    """``x`` (float32) rounded to ``target`` (float16) stochastically.

    Integer arithmetic on the bits, so that XLA fuses it into one pass over ``x``: adding a
    random number below one float16 spacing to the float32 bits and clearing the bits float16
    does not keep rounds the magnitude up with probability exactly the dropped fraction (a
    carry into the exponent lands on the next binade's first value, which is float16's next
    value too). Below float16's smallest normal the spacing is fixed (2**-24), and there the
    fraction is compared with a uniform number instead. (Finding both neighbours with
    ``nextafter``, XLA made four passes with float32 temporaries: Graphcore's mixed-precision
    tutorial CNN, float16 with AdamW, 188 ms per step on one core, 153 ms in one pass.)
    """
    drop, min_exponent, largest = 13, -14, 65504.0  # float16: see popxl/ops/_rounding.py
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    h = _hash(bits, seed)
    kept = np.uint32(~((1 << drop) - 1) & 0xFFFFFFFF)
    normal = jax.lax.bitcast_convert_type((bits + (h >> (32 - drop))) & kept, jnp.float32)
    quantum = 2.0 ** (min_exponent - (23 - drop))
    scaled = jnp.abs(x) * np.float32(1 / quantum)
    whole = jnp.floor(scaled)
    up = ((h >> 8).astype(jnp.float32) * np.float32(2.0**-24)) < (scaled - whole)
    small = jnp.copysign((whole + up.astype(jnp.float32)) * np.float32(quantum), x)
    rounded = jnp.where(jnp.abs(x) < np.float32(2.0**min_exponent), small, normal)
    # Infinities, NaNs and values past the largest float16 round as the ordinary cast does.
    keep = ~(jnp.abs(x) <= np.float32(largest))
    return jnp.where(keep, x, rounded).astype(target)


def lower_cast(env: Env, op: Op) -> None:
    """The lowering of a stochastically rounding cast."""
    target = op.attrs["data_type"]._np_device
    apply_results(env, op, stochastic_round(env.read(op.inputs[0]), target, op.id))


@rounded_cast
def _lower_rounded_cast(env: Env, op: Op) -> bool:
    """A cast the session rounds stochastically, lowered here (False: an ordinary cast)."""
    if not applies(op):
        return False
    lower_cast(env, op)
    return True
