"""Convolutions lowered for speed: the form is chosen per backend, shape and direction.

Off the CPU, convolutions stay ``lax.conv_general_dilated`` (cuDNN on a GPU). On XLA:CPU that
kernel is slow or catastrophic at shapes deep networks reach (a 3x3 kernel over a 2x2 map is
50x slower than the same arithmetic as a matmul, a depthwise convolution 10-100x, and the
input gradient of a VALID convolution falls off the fast path: ResNet-18's 512-channel 2x2
stage took 436 ms forward against 5.2 as a matmul, the whole network's forward and backward
3,049 against 372 ms; 2026-11-24), so every convolution there
is a ``custom_vjp`` whose forward, input gradient and weight gradient each take one of:

* ``matmul``: the kernel taps of the padded input stacked into patches and one matmul per
  group (im2col), built channels-first (``(C, N, *spatial)``) so the patches need no
  transpose; the input gradient is the matmul of the kernel with the cotangent, then the
  taps' scatter (col2im), the weight gradient the matmul of the patches with the cotangent.
* ``taps``: for depthwise convolutions (one input channel per group), a multiply-add per
  kernel tap, which XLA fuses into one loop.
* ``pointwise``: a 1x1 kernel of one group without padding as one product over the
  channels of the channels-last input, reading the weight as it is stored.
* ``lax``: XLA's own convolution, where it is faster, in every direction on channels-last
  operands (the input gradient one dilated convolution of the cotangent, the weight
  gradient one convolution over the batch).

``choose`` holds the rule, measured on the project's 2-core CPU (AVX2 until 2026-11-25,
AVX-512 since; ``bench/conv_lowering.py`` and ``bench/poptorch_zoo.py``). The
transposed convolution is the input gradient of a convolution, so it reuses the same forms.
The forms take and return ``NC*`` arrays; the matmul form transposes its input and output
(channels first), never the patches.

Imported lazily by the lowering rules: this module imports JAX.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from popxl.ops._base import dot_precision

from .forms import cpu_forms
from .taps import scatter_taps, tap_slice, taps
from .xla_workarounds import computed_once


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
    if not cpu_forms():
        common = jnp.promote_types(x.dtype, w.dtype)
        return _lax_conv(x.astype(common), w.astype(common), geo).astype(x.dtype)
    f = jnp.promote_types(x.dtype, jnp.float32)
    w, geo = _live_taps(x.shape[2:], w, geo)
    frames = w.ndim == 5 and geo.groups == 1 and _roomy(x.shape[3:], w.shape[3:], geo.dilation[1:])
    form: Any = _frames_conv if frames else _cpu_conv
    if x.dtype != f:
        return _narrowed(form(_widened(x, x.dtype), w.astype(f), geo), x.dtype)
    return form(x.astype(f), w.astype(f), geo).astype(x.dtype)


# A half-precision input and the float32 cotangent of a half-precision output, each widened
# into a buffer of its own: XLA:CPU otherwise converts them inside the transposes to and
# from the channels-last layout, element by element (the mixed-precision tutorial's float16
# CNN step: 52.3-61.9 -> 48.5-57.0 ms). The values are those of plain conversions.


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _widened(x: jax.Array, dtype: Any) -> jax.Array:
    return computed_once(x.astype(jnp.float32))


def _widened_fwd(x: jax.Array, dtype: Any) -> tuple:
    return _widened(x, dtype), None


def _widened_bwd(dtype: Any, _: Any, g: jax.Array) -> tuple:
    return (g.astype(dtype),)


_widened.defvjp(_widened_fwd, _widened_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _narrowed(y: jax.Array, dtype: Any) -> jax.Array:
    return y.astype(dtype)


def _narrowed_fwd(y: jax.Array, dtype: Any) -> tuple:
    return y.astype(dtype), None


def _narrowed_bwd(dtype: Any, _: Any, g: jax.Array) -> tuple:
    return (computed_once(g.astype(jnp.float32)),)


_narrowed.defvjp(_narrowed_fwd, _narrowed_bwd)


def _live_taps(spatial: Sequence[int], w: jax.Array, geo: Geometry) -> tuple[jax.Array, Geometry]:
    """The kernel without the taps that read only padding, and the geometry (pads) that
    gives the same output with it: the same convolution, with less arithmetic.

    A 3x3 kernel padded by 1 over a 1x1 map (ResNet's last stage on 32x32 images) reads
    the map with its centre tap alone, a 3x3x3 one over a single frame (R3D-18's last
    stage) with its middle kernel frame: the other taps multiply zeros, which the matmul
    form's patches would hold 9 and 3 times over. On each axis the taps that read some
    input position are a contiguous range; where all of them read only padding the axis
    is left as it is.
    """
    kernel = w.shape[2:]
    out = _out_shape((0, 0, *spatial), kernel, geo)
    keep, pads = [], []
    for n, k, (lo, hi), d, s, o in zip(spatial, kernel, geo.pads, geo.dilation, geo.stride, out):
        live = [t for t in range(k) if any(0 <= i * s + t * d - lo < n for i in range(o))]
        if not live or len(live) == k:
            keep.append(slice(None))
            pads.append((lo, hi))
            continue
        first, last = live[0], live[-1]
        low = lo - first * d
        keep.append(slice(first, last + 1))
        pads.append((low, (o - 1) * s + (last - first) * d + 1 - n - low))
    if all(k == slice(None) for k in keep):
        return w, geo
    return w[(slice(None), slice(None)) + tuple(keep)], geo._replace(pads=tuple(pads))


def _frames_conv(x: jax.Array, w: jax.Array, geo: Geometry) -> jax.Array:
    """A 3-D convolution as the sum, over its kernel's first axis, of 2-D convolutions of
    the input's frames (folded into the batch), each one ``_cpu_conv`` in its own form.

    XLA:CPU's 3-D kernel is 3-8x slower than its 2-D one for the same arithmetic
    (R3D-18's 64-channel 3x3x3 layer at 4x8x16x16: 104 against 36 ms; its 3x7x7 stem:
    323 against 42 ms), and 3-D patches are 27 times the input where few frames make the
    matmul form the choice. Only where the frames are roomy (their 2-D convolutions take
    XLA's kernel): on small frames the 3-D matmul form reads the weight as it is stored,
    where each frame's kernel would be a strided copy of it, which XLA:CPU made at 1 GB/s
    (R3D-18's inference on 2 cores: 538 -> 507 ms). Grouped ones keep their 3-D forms.

    Each kernel frame convolves only the input frames it reaches, and its outputs are
    padded to the full count in the sum (which XLA fuses): padding the input instead cost a
    copy of it per layer and 2-D convolutions of zero frames (R3D-18 on 2 cores: inference
    503 -> 420 ms, training step 1,742 -> 1,583 ms).
    """
    n, c, frames = x.shape[:3]
    depth = w.shape[2]
    (lo, hi), stride, dilation = geo.pads[0], geo.stride[0], geo.dilation[0]
    out = (frames + lo + hi - (depth - 1) * dilation - 1) // stride + 1
    plane = Geometry(geo.stride[1:], geo.pads[1:], geo.dilation[1:], geo.groups)
    if stride == 1:
        return _stacked_frames_conv(x, w, geo, out, plane)
    # The weight put kernel-last once, ``(D, H, W, I, O)``: each frame's kernel is then a
    # contiguous block, and its ``OIHW`` view below transposes back to what XLA's kernel
    # reads, which XLA folds away. Slicing ``w[:, :, i]`` strided the whole weight per frame.
    stacked = w.transpose(2, 3, 4, 1, 0)

    def frame_conv(i: int) -> jax.Array | None:
        # Output t reads input frame t * stride + i * dilation - lo; keep the t in range.
        shift = i * dilation - lo
        first = max(0, -(shift // stride))
        last = min(out - 1, (frames - 1 - shift) // stride)
        if last < first:
            return None
        start = first * stride + shift
        taken = lax.slice_in_dim(x, start, start + (last - first) * stride + 1, stride, axis=2)
        count = last - first + 1
        batch = jnp.moveaxis(taken, 2, 1).reshape(n * count, c, *taken.shape[3:])
        y = _cpu_conv(batch, stacked[i].transpose(3, 2, 0, 1), plane)
        y = y.reshape(n, count, *y.shape[1:])
        return _pad(y, ((first, out - 1 - last),) + ((0, 0),) * (y.ndim - 2))

    parts = [p for p in (frame_conv(i) for i in range(depth)) if p is not None]
    if not parts:  # every kernel frame lands in the padding
        shape = (n, out, w.shape[0], *_out_shape((n, c, *x.shape[3:]), w.shape[3:], plane))
        parts = [jnp.zeros(shape, x.dtype)]
    return jnp.moveaxis(functools.reduce(jnp.add, parts), 1, 2)


def _stacked_frames_conv(
    x: jax.Array, w: jax.Array, geo: Geometry, out: int, plane: Geometry
) -> jax.Array:
    """``_frames_conv`` at stride 1 in time: every input frame convolved once with every
    kernel frame, their kernels stacked along the output channels (``(D * M, C, kh, kw)``),
    then each output frame the sum of its kernel frames' results, shifted in time.

    One 2-D convolution rather than one per kernel frame: the weight is transposed whole
    (XLA:CPU tiles that; a frame's kernel sliced out of it was transposed element by
    element, 10-12 ms for each of R3D-18's 512-channel frames) and no input frames are
    sliced out per kernel frame.
    """
    n, c, frames = x.shape[:3]
    m, depth = w.shape[0], w.shape[2]
    lo, dilation = geo.pads[0][0], geo.dilation[0]
    kernels = w.transpose(2, 0, 1, 3, 4).reshape(depth * m, c, *w.shape[3:])
    batch = jnp.moveaxis(x, 2, 1).reshape(n * frames, c, *x.shape[3:])
    y = _cpu_conv(batch, kernels, plane)
    # Kernel frame i's outputs are channels i * M .. (i + 1) * M, sliced as channels (a
    # slice of the channels-last result; splitting out a kernel-frame axis made its
    # gradient transpose the cotangent, 25 ms per R3D-18 64-channel layer).
    y = y.reshape(n, frames, depth * m, *y.shape[2:])
    parts = []
    for i in range(depth):
        # Output t reads input frame t + shift; keep the t whose frame exists.
        shift = i * dilation - lo
        first, last = max(0, -shift), min(out - 1, frames - 1 - shift)
        if last < first:
            continue
        part = y[:, first + shift : last + shift + 1, i * m : (i + 1) * m]
        parts.append(_pad(part, ((first, out - 1 - last),) + ((0, 0),) * (part.ndim - 2)))
    if not parts:  # every kernel frame lands in the padding
        parts = [jnp.zeros((n, out, m, *y.shape[3:]), x.dtype)]
    return jnp.moveaxis(functools.reduce(jnp.add, parts), 1, 2)


def conv_transpose(x: jax.Array, w: jax.Array, geo: Geometry, out: tuple[int, ...]) -> jax.Array:
    """The transposed convolution: the input gradient of ``conv`` (``geo``) for an input of
    spatial shape ``out``, applied to ``x``; ``w`` is ``(C, M/groups, *kernel)``."""
    shape = (x.shape[0], w.shape[1] * geo.groups, *out)
    if not cpu_forms():
        common = jnp.promote_types(x.dtype, w.dtype)
        return _xla_conv_transpose(x.astype(common), w.astype(common), geo, shape).astype(x.dtype)
    f = jnp.promote_types(x.dtype, jnp.float32)
    return _cpu_conv_transpose(x.astype(f), w.astype(f), geo, shape).astype(x.dtype)


# The choice of form ------------------------------------------------------------------------


def choose(x_shape: tuple, w_shape: tuple, geo: Geometry, direction: str) -> str:
    """The fastest form on XLA:CPU for ``direction`` ("forward", "input" or "weight").

    Measured on a quiet machine with ``bench/conv_lowering.py`` and per form, unrolled and
    in a loop body (ResNet-18, tutorial 8's CNN, depthwise, 1-D and 3-D shapes): XLA's kernel
    (channels-last) is fast on maps at least twice the kernel's extent; on smaller maps
    (ResNet's last stages) it is 2-100x slower than the matmul. Its weight gradient, in a
    program whose transposes are sunk (``runtime/transpose_sinking``), beats building the
    patches on roomy maps (ResNet-18's SGD step 147 -> 127 ms on one core of an AVX-512
    CPU, 2026-11-25; unsunk, on an AVX2 one, the patches had won by 1.3-3x), except for a
    1x1 kernel, whose one tap is the input itself (MobileNetV2 105 against 117 ms). With at
    most 16 channels on either side
    (a network's first convolution, tutorial 8's and the mixed-precision tutorial's CNNs) its
    forward and input gradient lose to the matmul forms by 1.3-7x.
    """
    m, cg, *kernel = w_shape
    if _pointwise(geo, kernel) and direction == "forward":
        # The weight read as stored, where XLA's kernel wants it transposed every step
        # (MobileNetV2's training step 56.3 -> 53.7 ms, inference 8.0 -> 7.5 ms). Its input
        # and weight gradients as plain products were slower (YNNPACK's dot contracting the
        # leading axes: 0.70 against 0.26 ms for 1280x320), so they keep the rules below.
        return "pointwise"
    if cg == 1 and geo.groups > 1:
        return "taps"  # depthwise: XLA's kernel is 10-100x slower in every direction
    if geo.groups > 1:
        return "matmul"  # grouped: XLA's gradients are 10x slower
    if not _roomy(x_shape[2:], kernel, geo.dilation):
        return "matmul"
    if direction == "weight" and _pointwise(geo, kernel):
        # A product contracting the positions of the channels-last operands, or XLA's kernel
        # where the cotangent is the wider operand (its transpose there moves whole rows of
        # channels). The matmul form's channels-first transposes of both, with the ops that
        # produce them fused in, took S3D's 192 -> 576 weight gradient over 25,088 positions
        # to 139 ms (pointwise 119, XLA's kernel 77; 480 -> 192: 13.0, 7.6, 14.0).
        rows = x_shape[0] * math.prod(-(-n // s) for n, s in zip(x_shape[2:], geo.stride))
        return "lax" if m > cg and rows >= 512 else "pointwise"
    if direction == "weight" and max(cg, m) > 32 and math.prod(kernel) == 1:
        return "matmul"  # one tap: the patches are the input itself
    if max(cg, m) <= 16 and direction != "weight":
        # XLA hands convolutions this narrow to Eigen rather than YNNPACK: 2-7x slower than
        # the matmul forms, except a forward whose patches are many rows (5 -> 12 channels
        # at 5x5: 125 rows, where building them costs 4x XLA's kernel).
        if direction == "input" or cg * math.prod(kernel) <= 32:
            return "matmul"
    return "lax"


def _roomy(spatial: Sequence[int], kernel: Sequence[int], dilation: Sequence[int]) -> bool:
    """Every spatial axis at least twice the kernel's dilated extent."""
    return all(n >= 2 * ((k - 1) * d + 1) for k, d, n in zip(kernel, dilation, spatial))


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


def _channels_last_conv(
    lhs: jax.Array, rhs: jax.Array, geo: Geometry, lhs_dilation: tuple[int, ...] | None = None
) -> jax.Array:
    """XLA's kernel on ``N*C`` ``lhs`` and ``*IO`` ``rhs``, giving ``N*O``.

    The operands are transposed here rather than left to XLA's layout assignment: inside a
    loop body (a block repeated by ``scan``, a ``repeat``) XLA:CPU keeps the layout it gets,
    and its kernel runs 10-30x slower on ``NC*`` operands (ResNet-18's 64-channel 16x16
    convolution: 170 ms in a scan of four, 12 ms unrolled or channels-last), and JAX's own
    gradients of a convolution put the batch axis where the kernel wants channels (weight
    gradient of a 3-D convolution in a loop: 1.26 s against 63 ms). Outside loops the
    transposes fold into the layouts XLA would choose anyway.
    """
    nd = lhs.ndim - 2
    spatial = tuple(range(1, nd + 1))
    numbers = lax.ConvDimensionNumbers(
        (0, nd + 1, *spatial), (nd + 1, nd, *range(nd)), (0, nd + 1, *spatial)
    )
    return lax.conv_general_dilated(
        lhs,
        rhs,
        geo.stride,
        list(geo.pads),
        lhs_dilation=lhs_dilation,
        rhs_dilation=geo.dilation,
        dimension_numbers=numbers,
        feature_group_count=geo.groups,
        precision=dot_precision(lhs.dtype),
        preferred_element_type=jnp.float32 if lhs.dtype.itemsize < 4 else None,
    ).astype(lhs.dtype)


def _last(x: jax.Array) -> jax.Array:
    """``NC*`` -> ``N*C``."""
    return jnp.moveaxis(x, 1, -1)


def _kernel_last(w: jax.Array) -> jax.Array:
    """``(O, I, *kernel)`` -> ``(*kernel, I, O)``."""
    return w.transpose((*range(2, w.ndim), 1, 0))


def _lax_cl_conv(x: jax.Array, w: jax.Array, geo: Geometry) -> jax.Array:
    return jnp.moveaxis(_channels_last_conv(_last(x), _kernel_last(w), geo), -1, 1)


def _lax_cl_input_grad(w: jax.Array, geo: Geometry, x_shape: tuple, gy: jax.Array) -> jax.Array:
    """The input gradient as one convolution: the cotangent, dilated by the stride, with
    the adjoint kernel (flipped, channels swapped per group)."""
    reach = [(k - 1) * d for k, d in zip(w.shape[2:], geo.dilation)]
    pads = tuple(
        (r - lo, n + lo - (o - 1) * s - 1)
        for r, (lo, _), n, o, s in zip(reach, geo.pads, x_shape[2:], gy.shape[2:], geo.stride)
    )
    adjoint = geo._replace(stride=(1,) * len(reach), pads=pads)
    lhs = _last(gy)
    out = _channels_last_conv(
        lhs, _kernel_last(_adjoint_kernel(w, geo.groups)), adjoint, geo.stride
    )
    return jnp.moveaxis(out, -1, 1)


def _lax_cl_weight_grad(x: jax.Array, geo: Geometry, w_shape: tuple, gy: jax.Array) -> jax.Array:
    """The weight gradient as one convolution over the batch: the input (batch and channels
    swapped) under a window of the cotangent's extent, dilated by the stride."""
    if geo.groups > 1:
        return _vjp_weight(_lax_cl_conv, x, geo, w_shape, gy)
    kernel, out = w_shape[2:], gy.shape[2:]
    pads = tuple(
        (lo, (k - 1) * d + (o - 1) * s + 1 - n - lo)
        for (lo, _), k, d, o, s, n in zip(
            geo.pads, kernel, geo.dilation, out, geo.stride, x.shape[2:]
        )
    )
    lhs = jnp.moveaxis(x, 0, -1)  # (C, *spatial, N): the channels are the batch
    rhs = jnp.moveaxis(jnp.moveaxis(gy, 1, -1), 0, -2)  # (*out, N, O)
    window = Geometry(geo.dilation, pads, geo.stride, 1)
    return jnp.moveaxis(_channels_last_conv(lhs, rhs, window), -1, 0)  # (O, C, *kernel)


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


def _channels_first(x: jax.Array) -> jax.Array:
    """``(C, N, *spatial)``: the layout in which a group's patches are one matrix."""
    return x.swapaxes(0, 1)


def _patches(x: jax.Array, kernel: tuple, geo: Geometry) -> tuple[jax.Array, tuple]:
    """``(G, C/G * T, N * P)``: the input under each of the ``T`` kernel taps, as one matrix
    per group whose rows match ``w.reshape(G, M/G, C/G * T)``'s columns.

    Built from the ``(C, N, *spatial)`` input, so the patches (``T`` times the input) need
    no transpose before the matmul: only the input is transposed.
    """
    out = _out_shape(x.shape, kernel, geo)
    xp = _pad(_channels_first(x), geo.pads)
    if math.prod(kernel) > 8:
        cols = _stacked_by_axis(xp, kernel, (), geo, out)
    else:
        cols = jnp.stack([tap_slice(xp, t, geo.dilation, out, geo.stride) for t in taps(kernel)], 1)
    return cols.reshape(geo.groups, -1, x.shape[0] * math.prod(out)), out


def _stacked_by_axis(
    xp: jax.Array, kernel: tuple, tap: tuple, geo: Geometry, out: tuple
) -> jax.Array:
    """``(C, *kernel[len(tap):], N, *out)``: the taps that start with ``tap``, stacked one
    kernel axis at a time (a 3x3 kernel's nine as three stacks of three).

    XLA:CPU runs a concatenate of more than eight operands on its own, each operand first
    copied into a buffer of its own, where smaller ones fuse with their slices: in-process
    A/B, ms, flat / by axis: ResNeXt-50 training 219.2 / 213.6, 231.9 / 226.1, inference
    57.9 / 54.6; ResNet-50 training 162.0 / 160.4; tutorial 8's CNN (5x5) 6.83 / 6.65,
    6.29 / 6.11; R3D-18 inference 552 / 546.
    """
    if len(tap) == len(kernel):
        return tap_slice(xp, tap, geo.dilation, out, geo.stride)
    parts = [_stacked_by_axis(xp, kernel, (*tap, i), geo, out) for i in range(kernel[len(tap)])]
    return jnp.stack(parts, 1)


def _dot(a: jax.Array, b: jax.Array, contract: tuple, batch: tuple) -> jax.Array:
    return lax.dot_general(a, b, (contract, batch), precision=dot_precision(a.dtype))


def _grouped(gy: jax.Array, groups: int) -> jax.Array:
    """``(G, M/G, N * P)``: an output (or its cotangent) as one matrix per group."""
    return _channels_first(gy).reshape(groups, gy.shape[1] // groups, -1)


def _matmul_conv(x: jax.Array, w: jax.Array, geo: Geometry) -> jax.Array:
    m = w.shape[0]
    cols, out = _patches(x, tuple(w.shape[2:]), geo)
    # (G, M/G, K) x (G, K, N P) -> (G, M/G, N P): batch over groups, contract K.
    y = _dot(w.reshape(geo.groups, m // geo.groups, -1), cols, ((2,), (1,)), ((0,), (0,)))
    return _channels_first(y.reshape(m, x.shape[0], *out))


def _adjoint_kernel(w: jax.Array, groups: int) -> jax.Array:
    """The kernel of the adjoint convolution: flipped, in/out channels swapped per group."""
    m, cg, *kernel = w.shape
    w = w.reshape(groups, m // groups, cg, *kernel).swapaxes(1, 2)
    return jnp.flip(w.reshape(groups * cg, m // groups, *kernel), tuple(range(2, w.ndim - 1)))


def _col2im_input_grad(w: jax.Array, geo: Geometry, x_shape: tuple, gy: jax.Array) -> jax.Array:
    """The matmul of the kernel with the cotangent, then col2im (the taps' shifted sums).

    The kernel's leading axis is contracted, which the matmul reads in place; the "full"
    convolution of the cotangent would need the kernel flipped and transposed first, which
    cost more than the convolution on ResNet-18's 512-channel layers (8-19 ms per weight
    against a 125 ms training step)."""
    n, c, *spatial = x_shape
    m, cg, *kernel = w.shape
    g, nt, out = geo.groups, math.prod(kernel), gy.shape[2:]
    if 4 * n * math.prod(out) <= cg * nt:
        # Few positions (ResNet's last stages): the positions-major product, whose
        # contraction XLA:CPU hands to YNNPACK; kernel-major it runs on Eigen, 3-4x slower
        # (512 channels at 2x2, batch 8: 5.1 against 1.8 ms).
        # (G, M/G, N P) x (G, M/G, K) -> (G, N P, K), then (C, T, N, *out).
        cols = _dot(_grouped(gy, g), w.reshape(g, m // g, -1), ((1,), (1,)), ((0,), (0,)))
        cols = jnp.moveaxis(cols.reshape(g, n, *out, cg, nt), (-2, -1), (1, 2))
        cols = cols.reshape(c, nt, n, *out)
    else:
        # (G, M/G, K) x (G, M/G, N P) -> (G, K, N P), contracting M/G.
        cols = _dot(w.reshape(g, m // g, -1), _grouped(gy, g), ((1,), (1,)), ((0,), (0,)))
        cols = cols.reshape(c, -1, n, *out)
    parts = {t: cols[:, i] for i, t in enumerate(taps(tuple(kernel)))}
    padded = tuple(s + lo + hi for s, (lo, hi) in zip(spatial, geo.pads))
    # The taps' shifted sums computed once: a consumer that reads each element several times
    # (a max pool's gradient spreads each over its window) would otherwise repeat all of
    # them per read (the mixed-precision tutorial's CNN step: 61.0 -> 48.0 ms).
    dx = scatter_taps(parts, padded, geo.stride, geo.dilation)
    dx = computed_once(dx) if nt > 1 else dx
    return _channels_first(_pad(dx, geo.pads, -1))


def _matmul_weight_grad(x: jax.Array, geo: Geometry, w_shape: tuple, gy: jax.Array) -> jax.Array:
    cols, _ = _patches(x, tuple(w_shape[2:]), geo)
    # (G, M/G, N P) x (G, K, N P) -> (G, M/G, K), contracting N P.
    return _dot(_grouped(gy, geo.groups), cols, ((2,), (2,)), ((0,), (0,))).reshape(w_shape)


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
    products = (
        tap_slice(xp, t, geo.dilation, out, geo.stride)[:, :, None] * wt[:, :, i][expand]
        for i, t in enumerate(taps(kernel))
    )
    y = functools.reduce(jnp.add, products)
    return y.reshape(n, w.shape[0], *out)


def _taps_input_grad(w: jax.Array, geo: Geometry, x_shape: tuple, gy: jax.Array) -> jax.Array:
    n, c, *spatial = x_shape
    kernel = tuple(w.shape[2:])
    out = gy.shape[2:]
    wt = _depthwise(w, c)
    g3 = gy.reshape(n, c, -1, *out)
    padded = tuple(s + lo + hi for s, (lo, hi) in zip(spatial, geo.pads))
    expand = (slice(None),) * 2 + (None,) * len(out)
    if all(s == 1 for s in geo.stride):
        # The forward's own form: the cotangent, padded by the kernel's reach, under the
        # flipped kernel's taps. Each element reads its taps from one padded array, where
        # scattering each tap's product back made XLA test every tap's padding bounds per
        # element (8x144x16x16, 3x3: 1.20 -> 0.20 ms).
        reach = tuple((k - 1) * d for k, d in zip(kernel, geo.dilation))
        cot = _pad(g3, tuple((r, p - o) for r, p, o in zip(reach, padded, out)))
        last = math.prod(kernel) - 1
        products = (
            tap_slice(cot, t, geo.dilation, padded, (1,) * len(kernel)) * wt[:, :, last - i][expand]
            for i, t in enumerate(taps(kernel))
        )
        dx = functools.reduce(jnp.add, products).sum(2)
    else:
        parts = {t: (g3 * wt[:, :, i][expand]).sum(2) for i, t in enumerate(taps(kernel))}
        dx = scatter_taps(parts, padded, geo.stride, geo.dilation)
    return _pad(dx, geo.pads, -1)


def _taps_weight_grad(x: jax.Array, geo: Geometry, w_shape: tuple, gy: jax.Array) -> jax.Array:
    n, c = x.shape[:2]
    kernel = tuple(w_shape[2:])
    out = gy.shape[2:]
    xp = _pad(x, geo.pads)
    g3 = gy.reshape(n, c, -1, *out)
    axes = (0, *range(3, 3 + len(out)))
    small = n * math.prod(out) < 8192
    if small:  # the cotangent computed once, not in each tap's term of the reduction
        g3 = lax.optimization_barrier(g3)
    products = [
        g3 * tap_slice(xp, t, geo.dilation, out, geo.stride)[:, :, None] for t in taps(kernel)
    ]
    if small:
        # One reduction of every tap's product: XLA fuses the taps' slices into it, where
        # per-tap sums (handed to YNNPACK) each read a copy of the slice. 1.7-2.8x faster
        # up to 16x16 outputs at batch 16; 1.2x slower at 8x32x32 (both measured, one core).
        zeros = [jnp.zeros((), gy.dtype)] * len(products)
        grads = lax.reduce(products, zeros, _add_each, axes)
    else:
        grads = [p.sum(axes) for p in products]
    return jnp.stack(grads, -1).reshape(w_shape)


def _add_each(a: list[jax.Array], b: list[jax.Array]) -> list[jax.Array]:
    return [u + v for u, v in zip(a, b)]


def _pointwise(geo: Geometry, kernel: Sequence[int]) -> bool:
    """A 1x1 convolution of one group without padding: a product over the channels.

    A negative end pad only drops trailing positions the stride never reaches (``popxl``'s
    exact geometry gives one to every stride-2 1x1 convolution of an even map, ResNet's
    downsampling shortcuts). Those went to XLA's kernel, which transposed the weight every
    step (ResNeXt-50's 2048x1024 one: 12 ms of kernel time, though beside other work: the
    training steps of ResNet-50 and ResNeXt-50 came out 2-3% faster).
    """
    return (
        geo.groups == 1
        and math.prod(kernel) == 1
        and all(lo == 0 and hi <= 0 for lo, hi in geo.pads)
    )


def _strided(x: jax.Array, geo: Geometry) -> jax.Array:
    """The positions a 1x1 kernel reads at ``geo``'s stride, up to its (non-positive) end
    pads."""
    if all(s == 1 and hi == 0 for s, (_, hi) in zip(geo.stride, geo.pads)):
        return x
    index = (slice(None), slice(None)) + tuple(
        slice(0, n + hi, s) for n, s, (_, hi) in zip(x.shape[2:], geo.stride, geo.pads)
    )
    return x[index]


def _pointwise_conv(x: jax.Array, w: jax.Array, geo: Geometry) -> jax.Array:
    """``(N, *out, C) x (M, C) -> (N, *out, M)``: the weight read as it is stored (the
    product contracts its minor axis), the activations channels-last between sunk
    transposes."""
    xs = _last(_strided(x, geo))
    y = _dot(xs, w.reshape(w.shape[:2]), ((xs.ndim - 1,), (1,)), ((), ()))
    return jnp.moveaxis(y, -1, 1)


def _pointwise_input_grad(w: jax.Array, geo: Geometry, x_shape: tuple, gy: jax.Array) -> jax.Array:
    """``(N, *out, M) x (M, C) -> (N, *out, C)``, then zeros where a stride skipped."""
    g = _last(gy)
    dx = jnp.moveaxis(_dot(g, w.reshape(w.shape[:2]), ((g.ndim - 1,), (0,)), ((), ())), -1, 1)
    if dx.shape == tuple(x_shape):
        return dx
    config = [(0, 0, 0)] * 2 + [
        (0, n - (o - 1) * s - 1, s - 1) for n, o, s in zip(x_shape[2:], gy.shape[2:], geo.stride)
    ]
    return lax.pad(dx, jnp.zeros((), dx.dtype), config)


def _pointwise_weight_grad(x: jax.Array, geo: Geometry, w_shape: tuple, gy: jax.Array) -> jax.Array:
    """``(N, *out, M) x (N, *out, C) -> (M, C)``, contracting the batch and positions."""
    xs, g = _last(_strided(x, geo)), _last(gy)
    axes = tuple(range(g.ndim - 1))
    return _dot(g, xs, (axes, axes), ((), ())).reshape(w_shape)


class _Form(NamedTuple):
    forward: Any
    input_grad: Any
    weight_grad: Any


FORMS = {
    "lax": _Form(_lax_cl_conv, _lax_cl_input_grad, _lax_cl_weight_grad),
    "matmul": _Form(_matmul_conv, _col2im_input_grad, _matmul_weight_grad),
    "taps": _Form(_taps_conv, _taps_input_grad, _taps_weight_grad),
    "pointwise": _Form(_pointwise_conv, _pointwise_input_grad, _pointwise_weight_grad),
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
def _xla_conv_transpose(x: jax.Array, w: jax.Array, geo: Geometry, shape: tuple) -> jax.Array:
    """XLA's own kernels (off the CPU): the input gradient of the convolution, whose own
    gradients are the convolution of the cotangent and that convolution's weight gradient.
    (On an H200, cuDNN refused the weight gradient JAX derives by transposing the transpose,
    for a 3-D one with output padding: CUDNN_STATUS_BAD_PARAM.)"""
    return _vjp_input(_lax_conv, w, geo, shape, x)


def _xla_conv_transpose_fwd(x: jax.Array, w: jax.Array, geo: Geometry, shape: tuple) -> tuple:
    return _xla_conv_transpose(x, w, geo, shape), (x, w)


def _xla_conv_transpose_bwd(geo: Geometry, shape: tuple, res: tuple, gy: jax.Array) -> tuple:
    x, w = res
    return _lax_conv(gy, w, geo), _vjp_weight(_lax_conv, gy, geo, w.shape, x)


_xla_conv_transpose.defvjp(_xla_conv_transpose_fwd, _xla_conv_transpose_bwd)


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
