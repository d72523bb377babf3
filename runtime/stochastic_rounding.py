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
from popxl.ops._rounding import round_to

from .lowering import Env, apply_results, rounded_cast

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


def uniform(x: Any, seed: int) -> Any:
    """A number in [0, 1) per element of float32 ``x``, from its bits, position and ``seed``."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    index = jnp.arange(x.size, dtype=jnp.uint32).reshape(x.shape)
    salt = np.uint32((seed * int(_GOLDEN)) % (1 << 32))
    h = _mix(bits ^ _mix(index * _GOLDEN + salt))
    return (h >> 8).astype(jnp.float32) * np.float32(2.0**-24)


def stochastic_round(x: Any, target: Any, seed: int) -> Any:
    """``x`` (float32) rounded to ``target`` (a NumPy float dtype) stochastically."""
    near = round_to(x, target)  # not a cast round trip: XLA's GPU compiler folds those
    nearest = near.astype(target)
    toward = jnp.where(x > near, jnp.inf, -jnp.inf).astype(target)
    other = jnp.nextafter(nearest, toward)
    lo = jnp.minimum(nearest, other)
    hi = jnp.maximum(nearest, other)
    lo32, hi32 = lo.astype(jnp.float32), hi.astype(jnp.float32)
    p_hi = (x - lo32) / (hi32 - lo32)
    rounded = jnp.where(uniform(x, seed) < p_hi, hi, lo)
    keep = ~jnp.isfinite(x) | ~jnp.isfinite(near) | (x == near) | ~jnp.isfinite(p_hi)
    return jnp.where(keep, nearest, rounded)


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
