"""Pools lowered for speed: window maxima and sums without ``reduce_window``'s gradients.

JAX differentiates a max ``reduce_window`` with ``select_and_scatter``, which XLA:CPU runs
as a reduce-window with index outputs and a scatter, 5-15x slower than torch's pool
backward; and a sum ``reduce_window``'s gradient is another padded ``reduce_window``. Here
both are ``custom_vjp`` functions of the already padded ``(N, C, *spatial)`` input (the
windows are VALID):

* the forward is an elementwise maximum or sum of the kernel taps' strided slices (one
  fused loop: 2-4x faster than a reshape and a reduction over the window axes);
* where windows tile the input (kernel = stride, no dilation) the gradient is computed on
  the input reshaped to ``(N, C, o1, k1, o2, k2, ...)`` and reshaped back; with overlapping
  windows a max's gradient is scatter-added at each window's winning position, a sum's
  spread back tap by tap (``_taps.scatter_taps``).

A max sends each window's gradient to the first maximum in row-major order (or to a NaN),
as torch does, on every backend: XLA's ``select_and_scatter`` sends a NaN window's gradient
elsewhere, and JAX cannot differentiate a dilated max ``reduce_window`` at all. On an H200
these forms ran as fast as ``reduce_window`` and its gradient at the networks' pool shapes
(ResNet-18's stem pool at batch 8, 32x32: 0.05 ms forward, 0.07 ms with its gradient, either
way; 2026-11-27). A sum keeps ``reduce_window`` off the CPU.

Imported lazily by the lowering rules: this module imports JAX.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .forms import cpu_forms
from .taps import scatter_taps, tap_slice, taps
from .xla_workarounds import computed_once


def _out(size: tuple, kernel: tuple, stride: tuple, dilation: tuple) -> tuple[int, ...]:
    return tuple(
        (n - (k - 1) * d - 1) // s + 1 for n, k, s, d in zip(size, kernel, stride, dilation)
    )


def _cropped(xp: jax.Array, kernel: tuple, stride: tuple, dilation: tuple) -> jax.Array:
    """``xp`` without the trailing elements that no window reaches."""
    out = _out(xp.shape[2:], kernel, stride, dilation)
    used = tuple((o - 1) * s + (k - 1) * d + 1 for o, k, s, d in zip(out, kernel, stride, dilation))
    return xp[(Ellipsis,) + tuple(slice(0, u) for u in used)]


def _tiles(kernel: tuple, stride: tuple, dilation: tuple) -> bool:
    """Whether the windows tile the (cropped) input: one reshape groups them."""
    return all(k == s and d == 1 for k, s, d in zip(kernel, stride, dilation))


def _blocked_shape(shape: tuple, kernel: tuple) -> tuple[int, ...]:
    return (*shape[:2], *(a for n, k in zip(shape[2:], kernel) for a in (n // k, k)))


def _blocked(x: jax.Array, kernel: tuple) -> jax.Array:
    """``(N, C, o1, k1, o2, k2, ...)``: a tiled input, each window's elements on odd axes."""
    return x.reshape(_blocked_shape(x.shape, kernel))


def _between(kernel: tuple) -> tuple:
    """The index that gives a pooled ``(N, C, o1, o2, ...)`` array ``_blocked``'s rank."""
    return (slice(None),) * 2 + tuple(s for _ in kernel for s in (slice(None), None))


def _reduce_window(xp: jax.Array, op: Any, kernel: tuple, stride: tuple, dilation: tuple) -> Any:
    ones = (1, 1)
    # A NumPy (concrete) identity: JAX differentiates only the max and sum windows it knows
    # by their identity, and a traced one is not known.
    init = np.asarray(0 if op is lax.add else _lowest(xp.dtype), xp.dtype)
    return lax.reduce_window(
        xp, init, op, ones + kernel, ones + stride, "VALID", None, ones + dilation
    )


def _lowest(dtype: Any) -> Any:
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def window_max(xp: jax.Array, kernel: tuple, stride: tuple, dilation: tuple) -> jax.Array:
    """The maximum of every VALID window of the padded ``(N, C, *spatial)`` input ``xp``."""
    xp = _cropped(xp, kernel, stride, dilation)
    if not jnp.issubdtype(xp.dtype, jnp.floating):
        return _max(xp, kernel, stride, dilation)
    return _differentiable_max(xp, kernel, stride, dilation)


def _max(xp: jax.Array, kernel: tuple, stride: tuple, dilation: tuple) -> jax.Array:
    out = _out(xp.shape[2:], kernel, stride, dilation)
    slices = (tap_slice(xp, t, dilation, out, stride) for t in taps(kernel))
    return functools.reduce(jnp.maximum, slices)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _differentiable_max(xp: jax.Array, kernel: tuple, stride: tuple, dilation: tuple) -> jax.Array:
    return _max(xp, kernel, stride, dilation)


def _max_fwd(xp: jax.Array, kernel: tuple, stride: tuple, dilation: tuple) -> tuple:
    y = _max(xp, kernel, stride, dilation)
    return y, (xp, y)


def _max_bwd(kernel: tuple, stride: tuple, dilation: tuple, res: tuple, g: jax.Array) -> tuple:
    xp, y = res
    if _tiles(kernel, stride, dilation):
        return (_tiled_max_grad(xp, y, g, kernel),)
    return (_scattered_max_grad(xp, y, g, kernel, stride, dilation),)


def _scattered_max_grad(
    xp: jax.Array, y: jax.Array, g: jax.Array, kernel: tuple, stride: tuple, dilation: tuple
) -> jax.Array:
    """Overlapping windows: each window's gradient added at its first maximum's position.

    The winning tap is found in one pass over the taps (the last assignment is the first
    hit), its position in ``xp`` computed, and the gradients scatter-added there: one update
    per window. Stacking the taps for an argmax and adding each tap's share back with a
    shifted pad read every tap per element twice (S3D's 3x3x3 pool over 256x8x28x28: 215 ->
    15 ms; ResNet's 3x3 stride-2 pool over 8x64x32x32: 2.0 -> 1.4 ms).
    """
    # Channels-last, so that the transposes around a step's convolutions cancel with these
    # (runtime/transpose_sinking); one flat index per window and channel.
    xl, yl, gl = (jnp.moveaxis(a, 1, -1) for a in (xp, y, g))
    out, size = y.shape[2:], xp.shape[2:]
    spatial = range(1, 1 + len(kernel))
    channels = yl.shape[-1]
    winner = jnp.zeros(yl.shape, jnp.int32)
    for i, t in reversed(list(enumerate(taps(kernel)))):
        start = (0, *(a * d for a, d in zip(t, dilation)), 0)
        limit = (xl.shape[0], *(a + (o - 1) * r + 1 for a, o, r in zip(start[1:], out, stride)))
        element = lax.slice(xl, start, (*limit, channels), (1, *stride, 1))
        winner = jnp.where((element == yl) | jnp.isnan(element), i, winner)
    index = jnp.zeros(yl.shape, jnp.int32)  # within a sample: (position, channel)
    rest = winner
    for axis in reversed(spatial):
        k = kernel[axis - 1]
        tap, rest = rest % k, rest // k
        o = lax.broadcasted_iota(jnp.int32, yl.shape, axis)
        reach = o * stride[axis - 1] + tap * dilation[axis - 1]
        index += reach * math.prod(size[axis:])
    index = index * channels + lax.broadcasted_iota(jnp.int32, yl.shape, yl.ndim - 1)
    sample = math.prod(xl.shape[1:])
    if xl.size < _INDEX_LIMIT:  # one flat index
        index += lax.broadcasted_iota(jnp.int32, yl.shape, 0) * sample
        at = jnp.zeros((xl.size,), g.dtype).at[index.reshape(-1)]
    else:  # (sample, index within it): flat ones would overflow int32
        batch = lax.broadcasted_iota(jnp.int32, yl.shape, 0).reshape(-1)
        at = jnp.zeros((xl.shape[0], sample), g.dtype).at[batch, index.reshape(-1)]
    grad = at.add(gl.reshape(-1), mode="promise_in_bounds")
    return jnp.moveaxis(grad.reshape(xl.shape), -1, 1)


# Scatter indices are int32 (JAX without x64).
_INDEX_LIMIT = 2**31


def _tiled_max_grad(xp: jax.Array, y: jax.Array, g: jax.Array, kernel: tuple) -> jax.Array:
    blocks = _blocked(xp, kernel)
    expand = _between(kernel)
    winner = jnp.full(y.shape, math.prod(kernel), jnp.int32)
    for i, t in reversed(list(enumerate(taps(kernel)))):
        element = blocks[(slice(None),) * 2 + tuple(s for j in t for s in (slice(None), j))]
        hit = (element == y) | jnp.isnan(element)
        winner = jnp.where(hit, i, winner)
    order = jnp.arange(math.prod(kernel), dtype=jnp.int32).reshape(kernel)
    order = order.reshape((1, 1) + tuple(s for n in kernel for s in (1, n)))
    # Each window's winner is read by every element of the window. In half precision it is
    # computed once first (in a byte where it fits): otherwise XLA repeats it, with the
    # conversions that produced the pool's input, per element (the mixed-precision
    # tutorial's float16 CNN step: 75.7 -> 60.5 ms). In float32 the repeated compares cost
    # less than the guard's kernel (tutorial 8's CNN step: 0.5 ms of 7).
    if jnp.dtype(xp.dtype).itemsize < 4:
        narrow = jnp.int8 if math.prod(kernel) <= jnp.iinfo(jnp.int8).max else jnp.int32
        winner = computed_once(winner.astype(narrow)).astype(jnp.int32)
    grad = jnp.where(winner[expand] == order, g[expand], jnp.zeros((), g.dtype))
    return grad.reshape(xp.shape)


_differentiable_max.defvjp(_max_fwd, _max_bwd)


def window_sum(xp: jax.Array, kernel: tuple, stride: tuple, dilation: tuple) -> jax.Array:
    """The sum of every VALID window of the padded ``(N, C, *spatial)`` input ``xp``."""
    if not cpu_forms():
        return _reduce_window(xp, lax.add, kernel, stride, dilation)
    return _differentiable_sum(_cropped(xp, kernel, stride, dilation), kernel, stride, dilation)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _differentiable_sum(xp: jax.Array, kernel: tuple, stride: tuple, dilation: tuple) -> jax.Array:
    out = _out(xp.shape[2:], kernel, stride, dilation)
    return functools.reduce(
        jnp.add, (tap_slice(xp, t, dilation, out, stride) for t in taps(kernel))
    )


def _sum_fwd(xp: jax.Array, kernel: tuple, stride: tuple, dilation: tuple) -> tuple:
    return _differentiable_sum(xp, kernel, stride, dilation), xp.shape


def _sum_bwd(kernel: tuple, stride: tuple, dilation: tuple, shape: tuple, g: jax.Array) -> tuple:
    if _tiles(kernel, stride, dilation):
        spread = jnp.broadcast_to(g[_between(kernel)], _blocked_shape(shape, kernel))
        return (spread.reshape(shape),)
    return (scatter_taps({t: g for t in taps(kernel)}, shape[2:], stride, dilation),)


_differentiable_sum.defvjp(_sum_fwd, _sum_bwd)
