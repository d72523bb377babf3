"""Kernel taps: the strided slices a window op reads, and the adjoint that scatters them back.

A window op over a padded ``(N, C, *spatial)`` array (a convolution, a pool) reads, for each
kernel tap ``t`` (one offset per spatial axis), the strided slice starting at ``t * dilation``
with one element per output position. Expressing window ops as sums, maxima or matmuls of
these slices keeps them on XLA:CPU's fast elementwise and matmul kernels.

Imported lazily by the lowering rules: this module imports JAX.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

import jax
import jax.numpy as jnp
from jax import lax

Tap = tuple[int, ...]


def taps(kernel: tuple[int, ...]) -> Iterator[Tap]:
    """Every kernel offset, in row-major order (the order torch scans a window in)."""
    return itertools.product(*(range(k) for k in kernel))


def tap_slice(
    x: jax.Array, tap: Tap, dilation: tuple[int, ...], out: tuple[int, ...], stride: tuple[int, ...]
) -> jax.Array:
    """The elements of ``x``'s trailing spatial axes that tap ``tap`` reads for each output."""
    lead = x.ndim - len(tap)
    start = (0,) * lead + tuple(t * d for t, d in zip(tap, dilation))
    limit = x.shape[:lead] + tuple(
        t * d + (o - 1) * s + 1 for t, d, o, s in zip(tap, dilation, out, stride)
    )
    return lax.slice(x, start, limit, (1,) * lead + tuple(stride))


def scatter_taps(
    parts: Mapping[Tap, jax.Array],
    size: tuple[int, ...],
    stride: tuple[int, ...],
    dilation: tuple[int, ...],
) -> jax.Array:
    """The adjoint of ``tap_slice``: each tap's part added back where the tap read it.

    ``parts`` maps taps to ``(..., *out)`` arrays; the result has trailing spatial shape
    ``size``. Positions are split by their phase modulo the stride, so each phase grid is a
    sum of plain shifted pads and the grids interleave with one reshape: XLA:CPU runs pads
    with interior (stride) holes, the form autodiff of a strided slice gives, far slower.
    """
    first = next(iter(parts.values()))
    k = len(size)
    lead = first.shape[: first.ndim - k]
    out = first.shape[first.ndim - k :]
    cells = tuple(-(-n // s) for n, s in zip(size, stride))
    zero = jnp.zeros((), first.dtype)
    grids: dict[Tap, jax.Array] = {}
    for tap, part in parts.items():
        phase = tuple(t * d % s for t, d, s in zip(tap, dilation, stride))
        shift = [t * d // s for t, d, s in zip(tap, dilation, stride)]
        config = [(0, 0, 0)] * len(lead) + [
            (lo, c - o - lo, 0) for lo, c, o in zip(shift, cells, out)
        ]
        placed = lax.pad(part, zero, config)
        grids[phase] = grids[phase] + placed if phase in grids else placed
    if all(s == 1 for s in stride):
        whole = grids[(0,) * k]
    else:
        empty = jnp.zeros(lead + cells, first.dtype)
        phases = [grids.get(p, empty) for p in taps(stride)]
        stacked = jnp.stack(phases).reshape(stride + lead + cells)
        n = len(lead)
        order = [k + i for i in range(n)] + [j for a in range(k) for j in (k + n + a, a)]
        whole = stacked.transpose(order).reshape(lead + tuple(c * s for c, s in zip(cells, stride)))
    return whole[(Ellipsis,) + tuple(slice(0, n) for n in size)]
