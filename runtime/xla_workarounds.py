"""Guards against XLA miscompilations that change a program's numbers.

``fenced(values)``: XLA:CPU's algebraic simplifier moves a reshape that follows a
dynamic-update-slice across it, and the fused in-place write may then read elements of the
buffer it has already overwritten (openxla/xla#49176). The step under ``shard_map`` ends
with exactly that pattern: the new state, written row by row into stacked variables, gets
its leading replica axis back by a reshape. An AdamW step on stacked state read its
moments after writing them (1.34 learning rates instead of 1). An optimisation barrier
between the writes and the reshape keeps the reshape where it is; it costs nothing at run
time (it is an identity on the buffers).

``rounded(product)``: XLA:CPU copies an elementwise producer into every kernel that reads it,
and LLVM contracts a multiply feeding an add into one FMA in some of those kernels and not
in others (at ``--xla_backend_optimization_level=0``, per basic block), so the copies of one
value can differ in the last bit. A reduction's gradient that compares a value with its
maximum then finds no element equal to it and divides by a count of zero: a depthwise
convolution (a sum of per-tap products) followed by ``amin`` trained to NaN weights
(torch differential program 7300021974). A product rounded on its own is computed alike in
every copy.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax


def fenced(values: Any) -> Any:
    """``values`` (a pytree of arrays), with no reshape of them moved into their producers."""
    return lax.optimization_barrier(values)


def rounded(product: jax.Array) -> jax.Array:
    """``product``, rounded on its own before it is summed: never part of an FMA.

    The select on NaN, which changes nothing, is what stops the contraction; an
    ``optimization_barrier`` does not (XLA:CPU removes it before fusion).
    """
    return jnp.where(jnp.isnan(product), jnp.nan, product)
