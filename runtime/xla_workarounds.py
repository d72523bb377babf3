"""Guards against XLA miscompilations that change a program's numbers.

``fenced(values)``: XLA:CPU's algebraic simplifier moves a reshape that follows a
dynamic-update-slice across it, and the fused in-place write may then read elements of the
buffer it has already overwritten (openxla/xla#49176). The step under ``shard_map`` ends
with exactly that pattern: the new state, written row by row into stacked variables, gets
its leading replica axis back by a reshape. An AdamW step on stacked state read its
moments after writing them (1.34 learning rates instead of 1). An optimisation barrier
between the writes and the reshape keeps the reshape where it is; it costs nothing at run
time (it is an identity on the buffers).
"""

from __future__ import annotations

from typing import Any

from jax import lax


def fenced(values: Any) -> Any:
    """``values`` (a pytree of arrays), with no reshape of them moved into their producers."""
    return lax.optimization_barrier(values)
