"""Values kept in parts until their consumer is known, so replica sums cost what one large
batch costs.

Under ``jax.vmap`` replication every replica computes its own weight-sized gradient, and a
mean all-reduce then adds R of them up: R times the weight-sized work of one step on an
R-times batch. The lowering instead keeps two kinds of value *deferred*:

* ``WeightGrad``: the gradient of a 2-D matmul weight, as its operands (activations and
  cotangents). Its replica sum is one product of the gathered operands of all replicas.
* ``Accumulation``: an accumulator updated with a linear rule (``accumulate_``,
  ``accumulate_mean_``, ``accumulate_moving_average_``) from such a gradient. Its replica sum
  is carried along eagerly (``a·total + b·Σ_r x_r`` per update), its per-replica value only
  as a recipe.

A full-replica add/mean all-reduce (or reduce-scatter) takes the replica sum; any other
consumer reads ``value()``, exactly the per-replica result. Whatever is not used is traced
but never computed: XLA drops it.

``bench/replication.py`` (2026-11-21): R replicas on one device against one replica with
an R-times batch went from 1.2-1.3x (R = 2) and 1.4-1.5x (R = 4) its time to 1.0 and
1.0-1.05 with ``WeightGrad``; tutorial 3's accumulating step from 1.74x and 2.2x to
1.04-1.25x with ``Accumulation``.
"""

from __future__ import annotations

import contextlib
import contextvars
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from popxl.ops._base import dot_precision

Array = Any


def is_batched(value: Any) -> bool:
    """Whether ``value``, traced inside ``jax.vmap``, differs between replicas.

    Only meaningful at the step's top level: the body of a loop or branch is traced apart
    from ``vmap`` (``lax`` batches its jaxpr afterwards), so there every value looks
    unbatched. Lowering code asks ``may_differ`` instead.
    """
    from jax._src.interpreters import batching  # noqa: PLC0415 (no public API for this)

    return isinstance(value, batching.BatchTracer) and isinstance(value.batch_dim, int)


# How many loop, scan or branch bodies are being traced around the current op.
_BODY_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("body_depth", default=0)


@contextlib.contextmanager
def body_traced() -> Iterator[None]:
    """Mark the tracing of a ``lax`` loop, scan or branch body (see ``may_differ``)."""
    token = _BODY_DEPTH.set(_BODY_DEPTH.get() + 1)
    try:
        yield
    finally:
        _BODY_DEPTH.reset(token)


def may_differ(value: Any) -> bool:
    """Whether ``value`` may differ between replicas under ``vmap``: as ``vmap``'s tracer
    says at the step's top level; inside a body, for any traced value."""
    if is_batched(value):
        return True
    return _BODY_DEPTH.get() > 0 and isinstance(value, jax.core.Tracer)


def replica_sum(value: Any, axis_name: str, replicas: int) -> Array:
    """The sum over replicas of a deferred value or an array (inside the replica map)."""
    if isinstance(value, Deferred):
        return value.replica_sum(axis_name, replicas)
    if not may_differ(value):
        return value * replicas
    gathered = lax.all_gather(value, axis_name)
    total = gathered[0]
    for r in range(1, replicas):  # an unrolled sum: XLA's CPU reduce over this axis is slow
        total = total + gathered[r]
    return total


def value_of(value: Any) -> Array:
    return value.value() if isinstance(value, Deferred) else value


class Deferred(ABC):
    """A per-replica value not computed yet; see the module docstring."""

    @abstractmethod
    def value(self) -> Array:
        """This replica's value."""

    @abstractmethod
    def replica_sum(self, axis_name: str, replicas: int) -> Array:
        """The sum of every replica's ``value()``, computed cheaply."""


@dataclass(frozen=True)
class WeightGrad(Deferred):
    """The gradient of a 2-D matmul weight, ``lhsᵀ · dy`` summed over every leading
    dimension, as its operands."""

    lhs: Array  # (..., k): the matmul's left operand
    dy: Array  # (..., n): the cotangent of the matmul's result
    dtype: Any  # the weight's dtype

    def _product(self, lhs: Array, dy: Array) -> Array:
        lhs = lhs.reshape(-1, lhs.shape[-1]).T
        dy = dy.reshape(-1, dy.shape[-1])
        # Sums of products at float32 or wider, as the float16 matmul itself accumulates.
        wide = jnp.promote_types(self.dtype, jnp.float32)
        precision = dot_precision(lhs.dtype)
        return jnp.matmul(lhs, dy, precision=precision, preferred_element_type=wide).astype(
            self.dtype
        )

    def value(self) -> Array:
        return self._product(self.lhs, self.dy)

    def replica_sum(self, axis_name: str, replicas: int) -> Array:
        """One product of all replicas' operands, computed once."""
        return self._product(
            lax.all_gather(self.lhs, axis_name), lax.all_gather(self.dy, axis_name)
        )


@dataclass(frozen=True)
class Accumulation(Deferred):
    """``a · previous + b · x``, an accumulator after a linear update, with its replica sum
    ``total`` already computed. ``a`` and ``b`` are the same on every replica."""

    a: Array
    previous: Any  # an array or a Deferred
    b: Array
    x: Any  # an array or a Deferred
    total: Array
    dtype: Any  # the accumulator's

    def value(self) -> Array:
        x = value_of(self.x).astype(self.dtype)
        return (self.a * value_of(self.previous) + self.b * x).astype(self.dtype)

    def replica_sum(self, axis_name: str, replicas: int) -> Array:
        return self.total


@dataclass(frozen=True)
class Summed(Deferred):
    """A value with its replica sum, both arrays: what a deferred value becomes where it
    leaves a scanned or mapped run of calls (``runtime.calls``). It is a pytree of its two
    arrays, so ``lax.scan`` and ``jax.vmap`` stack and slice it like any output, and a
    later all-reduce of it still takes the sum instead of gathering every replica's value.
    """

    own: Array
    total: Array

    def value(self) -> Array:
        return self.own

    def replica_sum(self, axis_name: str, replicas: int) -> Array:
        return self.total


jax.tree_util.register_pytree_node(
    Summed, lambda s: ((s.own, s.total), None), lambda _, leaves: Summed(*leaves)
)


def portable(value: Any, axis_name: str | None, replicas: int) -> Any:
    """``value`` as arrays only: a deferred value as a ``Summed`` (under replication, where
    ``axis_name`` is set), an array as it is."""
    if not isinstance(value, Deferred) or isinstance(value, Summed):
        return value
    if axis_name is None:
        return value.value()
    return Summed(value.value(), value.replica_sum(axis_name, replicas))


# accumulate op key → (a, b) of its rule ``t ← a·t + b·x``, from the factor ``f``
LINEAR_ACCUMULATES = {
    "accumulate_": lambda f: (1.0, f),
    "accumulate_mean_": lambda f: (f / (f + 1), 1 / (f + 1)),
    "accumulate_moving_average_": lambda f: (f, 1 - f),
}


def deferred_accumulation(
    key: str, t: Any, x: Any, factor: Array, dtype: Any, axis_name: str, replicas: int
) -> Accumulation | None:
    """The result of accumulate op ``key`` as an ``Accumulation``, or None where that does
    not pay: only a deferred gradient or accumulator starts one.

    The total is ``Σ_r a·t_r + b·x_r``. Where the rule's factors may differ between
    replicas (a factor read from a tensor inside a loop body, where ``vmap`` cannot tell),
    each replica's terms are scaled before the sum: ``a`` times its accumulator, ``b``
    folded into a weight gradient's cotangent.
    """
    if not isinstance(x, Deferred) and not isinstance(t, Accumulation):
        return None
    a, b = LINEAR_ACCUMULATES[key](factor)
    if may_differ(a):
        t_total = replica_sum(a * value_of(t).astype(dtype), axis_name, replicas)
    else:
        t_total = a * replica_sum(t, axis_name, replicas).astype(dtype)
    if isinstance(x, WeightGrad):  # sum the replicas' gradients in the accumulator's dtype
        if may_differ(b):
            scaled = replace(x, dy=b * x.dy.astype(dtype), dtype=dtype)
            x_total = scaled.replica_sum(axis_name, replicas)
        else:
            x_total = b * replace(x, dtype=dtype).replica_sum(axis_name, replicas)
    elif may_differ(b):
        x_total = replica_sum(b * value_of(x).astype(dtype), axis_name, replicas)
    else:
        x_total = b * replica_sum(x, axis_name, replicas).astype(dtype)
    return Accumulation(a, t, b, x, (t_total + x_total).astype(dtype), dtype)


__all__ = [
    "LINEAR_ACCUMULATES",
    "Accumulation",
    "Deferred",
    "Summed",
    "WeightGrad",
    "deferred_accumulation",
    "body_traced",
    "is_batched",
    "may_differ",
    "portable",
    "replica_sum",
    "value_of",
]
