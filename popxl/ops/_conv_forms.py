"""Convolutions lowered for speed: the form is chosen per backend, shape and direction.

Off the CPU, convolutions stay ``lax.conv_general_dilated`` (cuDNN on a GPU). On XLA:CPU that
kernel is slow or catastrophic at shapes deep networks reach (a 3x3 kernel over a 2x2 map is
50x slower than the same arithmetic as a matmul, a depthwise convolution 10-100x, and the
input gradient of a VALID convolution falls off the fast path), so every convolution there
is a ``custom_vjp`` whose forward, input gradient and weight gradient each take one of:

* ``matmul``: the kernel taps of the padded input stacked into patches and one matmul per
  group (im2col); the input gradient is the matmul with the kernel followed by the taps'
  scatter (col2im), the weight gradient the matmul of the patches with the cotangent.
* ``taps``: for depthwise convolutions (one input channel per group), a multiply-add per
  kernel tap, which XLA fuses into one loop.
* ``lax``: XLA's own convolution (and JAX's rules for its gradients), where it is faster.

``choose`` holds the rule, measured on a 2-core AVX2 CPU (``bench/conv_lowering.py``). The
transposed convolution is the input gradient of a convolution, so it reuses the same forms.
Everything works in ``NC*`` layout, so no transposes are added around the convolution.

Imported lazily by the lowering rules: this module imports JAX.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ._base import dot_precision
from ._taps import scatter_taps, tap_slice, taps


class Geometry(NamedTuple):
    """A convolution's static arguments (per spatial axis, pads as ``(low, high)``)."""

    stride: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    dilation: tuple[int, ...]
    groups: int


def conv(x: jax.Array, w: jax.Array, geo: Geometry) -> jax.Array:
    """``NC*`` convolution of ``x`` with ``w`` (``(M, C/groups, *kernel)``), in ``x``'s dtype.

    float16 and bfloat16 operands are multiplied exactly and accumulated in float32.
    """
    if jax.default_backend() != "cpu":
        return _lax_conv(x, w, geo)
    f = jnp.promote_types(x.dtype, jnp.float32)
    return _cpu_conv(x.astype(f), w.astype(f), geo).astype(x.dtype)


def conv_transpose(x: jax.Array, w: jax.Array, geo: Geometry, out: tuple[int, ...]) -> jax.Array:
    """The transposed convolution: the input gradient of ``conv`` (``geo``) for an input of
    spatial shape ``out``, applied to ``x``; ``w`` is ``(C, M/groups, *kernel)``."""
    shape = (x.shape[0], w.shape[1] * geo.groups, *out)
    if jax.default_backend() != "cpu":
        return _vjp_input(_lax_conv, w, geo, shape, x)
    f = jnp.promote_types(x.dtype, jnp.float32)
    return _cpu_conv_transpose(x.astype(f), w.astype(f), geo, shape).astype(x.dtype)


# The choice of form ------------------------------------------------------------------------


def choose(x_shape: tuple, w_shape: tuple, geo: Geometry, direction: str) -> str:
    """The fastest form on XLA:CPU for ``direction`` ("forward", "input" or "weight")."""
    m, cg, *kernel = w_shape
    if cg == 1 and geo.groups > 1:
        return "taps"  # depthwise: XLA's kernel is 10-100x slower in every direction
    spatial = x_shape[2:]
    fits = all((k - 1) * d + 1 <= n for k, d, n in zip(kernel, geo.dilation, spatial))
    if not fits or geo.groups > 1:
        return "matmul"  # a kernel wider than the map: XLA's kernel is 50-100x slower
    c = cg * geo.groups
    if direction == "forward" and c <= 4 < 16 < m:
        return "lax"  # a stem (RGB in, many channels out): patches too thin for a matmul
    if direction == "weight" and max(c, m) <= 32:
        return "lax"  # few channels: the patches cost more than XLA's kernel
    return "matmul"


# The forms: forward, input gradient, weight gradient ----------------------------------------


def _lax_conv(x: jax.Array, w: jax.Array, geo: Geometry) -> jax.Array:
    out = lax.conv_general_dilated(
        x,
        w,
        geo.stride,
        list(geo.pads),
        rhs_dilation=geo.dilation,
        feature_group_count=geo.groups,
        precision=dot_precision(x.dtype),
        preferred_element_type=jnp.float32 if x.dtype.itemsize < 4 else None,
    )
    return out.astype(x.dtype)


def _vjp_input(form: Any, w: jax.Array, geo: Geometry, x_shape: tuple, g: jax.Array) -> jax.Array:
    x = jnp.zeros(x_shape, g.dtype)
    return jax.vjp(lambda x: form(x, w, geo), x)[1](g)[0]


def _vjp_weight(form: Any, x: jax.Array, geo: Geometry, w_shape: tuple, g: jax.Array) -> jax.Array:
    w = jnp.zeros(w_shape, g.dtype)
    return jax.vjp(lambda w: form(x, w, geo), w)[1](g)[0]


def _out_shape(x_shape: tuple, kernel: tuple, geo: Geometry) -> tuple[int, ...]:
    return tuple(
        (n + lo + hi - (k - 1) * d - 1) // s + 1
        for n, k, (lo, hi), d, s in zip(x_shape[2:], kernel, geo.pads, geo.dilation, geo.stride)
    )


def _pad(x: jax.Array, pads: tuple[tuple[int, int], ...], sign: int = 1) -> jax.Array:
    """``x`` zero-padded by ``pads`` (``sign=-1``: the inverse, which crops them again)."""
    config = [(0, 0, 0)] * (x.ndim - len(pads)) + [(sign * lo, sign * hi, 0) for lo, hi in pads]
    return lax.pad(x, jnp.zeros((), x.dtype), config)


def _patches(x: jax.Array, kernel: tuple, geo: Geometry) -> tuple[jax.Array, tuple]:
    """``(N, C, T, *out)``: the input under each of the ``T`` kernel taps."""
    out = _out_shape(x.shape, kernel, geo)
    xp = _pad(x, geo.pads)
    cols = [tap_slice(xp, t, geo.dilation, out, geo.stride) for t in taps(kernel)]
    return jnp.stack(cols, 2), out


def _dot(a: jax.Array, b: jax.Array, contract: tuple, batch: tuple) -> jax.Array:
    return lax.dot_general(a, b, (contract, batch), precision=dot_precision(a.dtype))


def _matmul_conv(x: jax.Array, w: jax.Array, geo: Geometry) -> jax.Array:
    n, c = x.shape[:2]
    m, cg, *kernel = w.shape
    g = geo.groups
    cols, out = _patches(x, tuple(kernel), geo)
    cols = cols.reshape(n, g, cg * cols.shape[2], -1)
    wm = w.reshape(g, m // g, -1)
    # (G, M/G, K) x (N, G, K, P) -> (G, M/G, N, P): batch over groups, contract K.
    y = _dot(wm, cols, ((2,), (2,)), ((0,), (1,)))
    return y.transpose(2, 0, 1, 3).reshape(n, m, *out)


def _matmul_input_grad(w: jax.Array, geo: Geometry, x_shape: tuple, gy: jax.Array) -> jax.Array:
    n, c, *spatial = x_shape
    m, cg, *kernel = w.shape
    g, out = geo.groups, gy.shape[2:]
    wm = w.reshape(g, m // g, -1)
    gm = gy.reshape(n, g, m // g, -1)
    # (G, M/G, K) x (N, G, M/G, P) -> (G, K, N, P), contracting M/G.
    cols = _dot(wm, gm, ((1,), (2,)), ((0,), (1,)))
    cols = cols.transpose(2, 0, 1, 3).reshape(n, c, -1, *out)
    parts = {t: cols[:, :, i] for i, t in enumerate(taps(tuple(kernel)))}
    padded = tuple(s + lo + hi for s, (lo, hi) in zip(spatial, geo.pads))
    return _pad(scatter_taps(parts, padded, geo.stride, geo.dilation), geo.pads, -1)


def _matmul_weight_grad(x: jax.Array, geo: Geometry, w_shape: tuple, gy: jax.Array) -> jax.Array:
    n = x.shape[0]
    m, cg, *kernel = w_shape
    g = geo.groups
    cols, _ = _patches(x, tuple(kernel), geo)
    cols = cols.reshape(n, g, cg * cols.shape[2], -1)
    gm = gy.reshape(n, g, m // g, -1)
    # (N, G, M/G, P) x (N, G, K, P) -> (G, M/G, K), contracting N and P.
    return _dot(gm, cols, ((0, 3), (0, 3)), ((1,), (1,))).reshape(w_shape)


def _depthwise(w: jax.Array, c: int) -> jax.Array:
    """``(C, mult, T)``: the weights of each input channel's outputs, per kernel tap."""
    return w.reshape(c, w.shape[0] // c, -1)


def _taps_conv(x: jax.Array, w: jax.Array, geo: Geometry) -> jax.Array:
    n, c = x.shape[:2]
    kernel = w.shape[2:]
    out = _out_shape(x.shape, kernel, geo)
    xp = _pad(x, geo.pads)
    wt = _depthwise(w, c)
    expand = (slice(None),) * 2 + (None,) * len(out)
    y = sum(
        tap_slice(xp, t, geo.dilation, out, geo.stride)[:, :, None] * wt[:, :, i][expand]
        for i, t in enumerate(taps(kernel))
    )
    return y.reshape(n, w.shape[0], *out)


def _taps_input_grad(w: jax.Array, geo: Geometry, x_shape: tuple, gy: jax.Array) -> jax.Array:
    n, c, *spatial = x_shape
    out = gy.shape[2:]
    wt = _depthwise(w, c)
    g3 = gy.reshape(n, c, -1, *out)
    expand = (slice(None),) * 2 + (None,) * len(out)
    parts = {t: (g3 * wt[:, :, i][expand]).sum(2) for i, t in enumerate(taps(w.shape[2:]))}
    padded = tuple(s + lo + hi for s, (lo, hi) in zip(spatial, geo.pads))
    return _pad(scatter_taps(parts, padded, geo.stride, geo.dilation), geo.pads, -1)


def _taps_weight_grad(x: jax.Array, geo: Geometry, w_shape: tuple, gy: jax.Array) -> jax.Array:
    n, c = x.shape[:2]
    kernel = tuple(w_shape[2:])
    out = gy.shape[2:]
    xp = _pad(x, geo.pads)
    g3 = gy.reshape(n, c, -1, *out)
    axes = (0, *range(3, 3 + len(out)))
    grads = [
        (g3 * tap_slice(xp, t, geo.dilation, out, geo.stride)[:, :, None]).sum(axes)
        for t in taps(kernel)
    ]
    return jnp.stack(grads, -1).reshape(w_shape)


class _Form(NamedTuple):
    forward: Any
    input_grad: Any
    weight_grad: Any


FORMS = {
    "lax": _Form(
        _lax_conv,
        lambda w, geo, x_shape, g: _vjp_input(_lax_conv, w, geo, x_shape, g),
        lambda x, geo, w_shape, g: _vjp_weight(_lax_conv, x, geo, w_shape, g),
    ),
    "matmul": _Form(_matmul_conv, _matmul_input_grad, _matmul_weight_grad),
    "taps": _Form(_taps_conv, _taps_input_grad, _taps_weight_grad),
}


def _form(x_shape: tuple, w_shape: tuple, geo: Geometry, direction: str) -> _Form:
    return FORMS[choose(x_shape, w_shape, geo, direction)]


# The differentiable convolutions ---------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _cpu_conv(x: jax.Array, w: jax.Array, geo: Geometry) -> jax.Array:
    return _form(x.shape, w.shape, geo, "forward").forward(x, w, geo)


def _cpu_conv_fwd(x: jax.Array, w: jax.Array, geo: Geometry) -> tuple:
    return _cpu_conv(x, w, geo), (x, w)


def _cpu_conv_bwd(geo: Geometry, res: tuple, gy: jax.Array) -> tuple:
    x, w = res
    dx = _form(x.shape, w.shape, geo, "input").input_grad(w, geo, x.shape, gy)
    dw = _form(x.shape, w.shape, geo, "weight").weight_grad(x, geo, w.shape, gy)
    return dx, dw


_cpu_conv.defvjp(_cpu_conv_fwd, _cpu_conv_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _cpu_conv_transpose(x: jax.Array, w: jax.Array, geo: Geometry, shape: tuple) -> jax.Array:
    return _form(shape, w.shape, geo, "input").input_grad(w, geo, shape, x)


def _cpu_conv_transpose_fwd(x: jax.Array, w: jax.Array, geo: Geometry, shape: tuple) -> tuple:
    return _cpu_conv_transpose(x, w, geo, shape), (x, w)


def _cpu_conv_transpose_bwd(geo: Geometry, shape: tuple, res: tuple, gy: jax.Array) -> tuple:
    # y = A_w^T x, with A_w the convolution: dx = A_w gy, and dw is the weight gradient of
    # the convolution of gy whose cotangent is x.
    x, w = res
    dx = _form(shape, w.shape, geo, "forward").forward(gy, w, geo)
    dw = _form(shape, w.shape, geo, "weight").weight_grad(gy, geo, w.shape, x)
    return dx, dw


_cpu_conv_transpose.defvjp(_cpu_conv_transpose_fwd, _cpu_conv_transpose_bwd)
