"""Guards against XLA behaviour that changes a program's numbers or multiplies its work.

``fenced(values)``: XLA:CPU's algebraic simplifier moves a reshape that follows a
dynamic-update-slice across it, and the fused in-place write may then read elements of the
buffer it has already overwritten (openxla/xla#49176). The step under ``shard_map`` ends
with exactly that pattern: the new state, written row by row into stacked variables, gets
its leading replica axis back by a reshape. An AdamW step on stacked state read its
moments after writing them (1.34 learning rates instead of 1). An optimisation barrier
between the writes and the reshape keeps the reshape where it is; it costs nothing at run
time (it is an identity on the buffers).

``computed_once(x)``: XLA:CPU fuses a chain of cheap elementwise ops (adds, pads, slices,
converts) into every consumer, also one that reads each element several times, such as a
broadcast: the chain is then evaluated once per read. A max pool's gradient spreads each
window's cotangent and winner over the window's elements, so in the mixed-precision
tutorial's CNN the second convolution's input gradient (25 shifted sums) and the winners
(with the float16 conversions of the pool's input) were computed four times over: 15 of
the float32 step's 60 ms. XLA fuses a reduction into a consumer that reuses its elements
only when it is cheap, and it counts every reduction as costly; an OR over a pair made of
the value's bits and zeros is an exact identity that neither XLA's simplifier nor YNNPACK
(which takes additions and maxima from XLA:CPU) removes or takes over. Guarding col2im's
result and the pool's winners took that CNN's step from 59.3 to 46.0 ms in float32 and from
67.1 to 54.4 ms in float16 (2026-11-27).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .forms import cpu_forms


def fenced(values: Any) -> Any:
    """``values`` (a pytree of arrays), with no reshape of them moved into their producers."""
    return lax.optimization_barrier(values)


def computed_once(x: jax.Array) -> jax.Array:
    """``x``, bit for bit, computed into its own buffer rather than fused into consumers
    that read its elements repeatedly (on XLA:CPU; elsewhere ``x`` itself)."""
    if not cpu_forms() or x.size == 0:
        return x
    bits = jnp.dtype(f"int{8 * x.dtype.itemsize}") if x.dtype != jnp.bool_ else jnp.int8
    as_bits = lax.bitcast_convert_type(x, bits) if x.dtype != jnp.bool_ else x.astype(bits)
    pair = lax.pad(as_bits[None], jnp.zeros((), bits), [(0, 1, 0)] + [(0, 0, 0)] * x.ndim)
    once = lax.reduce(pair, jnp.zeros((), bits), lax.bitwise_or, (0,))
    return lax.bitcast_convert_type(once, x.dtype) if x.dtype != jnp.bool_ else once != 0
