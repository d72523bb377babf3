"""Pooling, padding, upsampling, grid sampling and embeddings (lookups and pooled bags).

Max pools are popxl's ``MaxPool``; their indices (torch's flat position in each input
plane), when read, come from one gather of every window. Average pools without counted
padding are popxl's ``AveragePool``; with counted padding, a divisor override or
``ceil_mode`` windows that leave the padding, a windowed sum divided by torch's divisor.

Adaptive pools and upsampling are separable: each spatial axis gathers a few input
positions (``taps``) per output position, with weights (linear, cubic, averaging) or a
mask (max). The positions and weights depend only on the shapes, so they are computed
here, in float32 as torch's CPU kernels do, and recorded as attributes.

Grid sampling (``F.grid_sample``) is popxl's ``GridSample``.

Reflection, replication and circular padding are kept whole (their decompositions are
index arithmetic) and are ``jnp.pad``'s ``reflect``, ``edge`` and ``wrap``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from torch.ops import aten

import popxl
from popxl import ops

from .registry import NodeContext, lowering

_Taps = tuple[tuple[tuple[int, ...], ...], tuple[tuple[float, ...], ...]]


def _ints(values: Any, n: int, default: int | None = None) -> tuple[int, ...]:
    """Per-axis ints from torch's list (one value for every axis; empty: ``default``)."""
    if isinstance(values, int):
        values = [values]
    values = [] if values is None else list(values)
    if not values and default is not None:
        values = [default]
    if len(values) == 1 and n > 1:
        values = values * n
    return tuple(int(v) for v in values)


def _float_dtype(x: Any) -> Any:
    """float16 data is blended in float32, as torch's CPU kernels do."""
    return jnp.float32 if x.dtype == jnp.float16 else x.dtype


# Separable gathers ---------------------------------------------------------------------------


def _blend(x: Any, axes_taps: tuple[tuple[int, _Taps], ...]) -> Any:
    """For each ``(axis, (index, weight))``: ``out[o] = sum_t x[index[o][t]] * weight[o][t]``."""
    y = x.astype(_float_dtype(x))
    for axis, (index, weight) in axes_taps:
        idx, w = np.asarray(index), np.asarray(weight, np.float32)
        shape = [1] * y.ndim
        shape[axis] = idx.shape[0]
        parts = [
            jnp.take(y, idx[:, t], axis=axis) * jnp.asarray(w[:, t], y.dtype).reshape(shape)
            for t in range(idx.shape[1])
        ]
        y = sum(parts[1:], parts[0])
    return y.astype(x.dtype)


def _select(x: Any, axes_index: tuple[tuple[int, tuple[int, ...]], ...]) -> Any:
    """For each ``(axis, index)``: ``out[o] = x[index[o]]`` (nearest-neighbour)."""
    for axis, index in axes_index:
        x = jnp.take(x, np.asarray(index), axis=axis)
    return x


def _window_gather(x: Any, windows: tuple[_Taps, ...]) -> tuple[Any, Any, Any]:
    """Every window of the last ``len(windows)`` axes: the values ``(..., *out, taps)``,
    whether each tap lies inside the input, and its flat position in the input plane.
    Per axis, ``windows`` holds positions ``(out, taps)`` and 1/0 validity flags."""
    n = len(windows)
    lead = x.ndim - n
    sizes = x.shape[lead:]
    index = [np.clip(np.asarray(w[0]), 0, s - 1) for w, s in zip(windows, sizes)]
    y = x
    for a in range(n):  # axis a becomes (out_a, taps_a) at lead + 2a
        y = jnp.take(y, index[a], axis=lead + 2 * a)
    order = [lead + 2 * a for a in range(n)] + [lead + 2 * a + 1 for a in range(n)]
    y = jnp.transpose(y, list(range(lead)) + order)
    outs = y.shape[lead : lead + n]
    valid = np.ones((1,) * (2 * n), bool)
    flat = np.zeros((1,) * (2 * n), np.int64)
    for a in range(n):
        shape = [1] * (2 * n)
        shape[a], shape[n + a] = index[a].shape
        valid = valid & np.asarray(windows[a][1], bool).reshape(shape)
        flat = flat + index[a].reshape(shape) * int(np.prod(sizes[a + 1 :], dtype=np.int64))
    return y.reshape(*y.shape[:lead], *outs, -1), valid.reshape(*outs, -1), flat.reshape(*outs, -1)


def _window_max(x: Any, windows: tuple[_Taps, ...]) -> tuple[Any, Any]:
    """The max of each window and torch's index of it (first maximum, NaN wins)."""
    y, valid, flat = _window_gather(x, windows)
    low = jnp.asarray(-jnp.inf, x.dtype)
    y = jnp.where(valid, y, low)
    pick = jnp.argmax(jnp.where(jnp.isnan(y), jnp.inf, y), axis=-1)
    flat = jnp.broadcast_to(jnp.asarray(flat, jnp.int32), y.shape)
    value = jnp.take_along_axis(y, pick[..., None], axis=-1)[..., 0]
    index = jnp.take_along_axis(flat, pick[..., None], axis=-1)[..., 0]
    return value, index


def _window_argmax(x: Any, windows: tuple[_Taps, ...]) -> Any:
    return _window_max(x, windows)[1]


def _taps(rows: Iterable[Iterable[int]], ok: Iterable[Iterable[float]]) -> _Taps:
    return tuple(tuple(int(v) for v in r) for r in rows), tuple(
        tuple(float(v) for v in r) for r in ok
    )


# Max and average pools ----------------------------------------------------------------------


def _pool_windows(size: int, out: int, kernel: int, stride: int, pad: int, dilation: int) -> _Taps:
    """Input positions of each output's window (and whether each lies inside the input)."""
    pos = np.arange(out)[:, None] * stride - pad + np.arange(kernel)[None, :] * dilation
    return _taps(pos, (pos >= 0) & (pos < size))


def _max_pool(
    ctx: NodeContext,
    x: popxl.Tensor,
    n: int,
    kernel_size: Any,
    stride: Any = (),
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> tuple[popxl.Tensor, popxl.Tensor | None]:
    kernel = _ints(kernel_size, n)
    strides = _ints(stride, n) or kernel
    pads = _ints(padding, n, 0)
    dil = _ints(dilation, n, 1)
    values = ops.max_pool(x, kernel, strides, pads * 2, dilation=dil, ceil_mode=bool(ceil_mode))
    if tuple(values.shape) != ctx.out_shape:
        raise ValueError(
            f"max_pool: popxl's output shape {values.shape} differs from torch's "
            f"{ctx.out_shape} (kernel {kernel}, stride {strides}, padding {pads})."
        )
    if not ctx.output_used(1):
        return values, None
    sizes, outs = x.shape[-n:], ctx.out_shape[-n:]
    windows = tuple(
        _pool_windows(sizes[a], outs[a], kernel[a], strides[a], pads[a], dil[a]) for a in range(n)
    )
    indices = ctx.jax(
        "max_pool_indices",
        _window_argmax,
        x,
        outputs=[ctx.out_spec(1)],
        nondiff=(0,),
        windows=windows,
    )
    return values, indices


@lowering(aten.max_pool2d_with_indices.default)
def _lower_max_pool2d(ctx: NodeContext, x: popxl.Tensor, *args: Any) -> tuple:
    return _max_pool(ctx, x, 2, *args)


@lowering(aten.max_pool3d_with_indices.default)
def _lower_max_pool3d(ctx: NodeContext, x: popxl.Tensor, *args: Any) -> tuple:
    return _max_pool(ctx, x, 3, *args)


def _avg_divisor(
    sizes: tuple[int, ...],
    outs: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    pads: tuple[int, ...],
    count_include_pad: bool,
) -> np.ndarray:
    """torch's divisor of each window: its size clipped to the padded input (with
    ``count_include_pad``) or to the input."""
    div = np.ones((), np.float32)
    for size, out, k, s, p in zip(sizes, outs, kernel, strides, pads):
        start = np.arange(out) * s - p
        end = np.minimum(start + k, size + p)
        if not count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, size)
        div = np.multiply.outer(div, (end - start).astype(np.float32))
    return div


def _avg_pool(
    x: Any,
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    pads: tuple[int, ...],
    outs: tuple[int, ...],
    count_include_pad: bool,
    divisor: float,
) -> Any:
    """Windowed sums over the zero-padded input divided by torch's divisor."""
    n = len(kernel)
    sizes = x.shape[-n:]
    dtype = _float_dtype(x)
    extra = [
        max(0, (o - 1) * s + k - (i + 2 * p))
        for o, s, k, i, p in zip(outs, strides, kernel, sizes, pads)
    ]
    padding = [(0, 0)] * (x.ndim - n) + [(p, p + e) for p, e in zip(pads, extra)]
    window = (1,) * (x.ndim - n) + kernel
    total = lax.reduce_window(
        x.astype(dtype), 0.0, lax.add, window, (1,) * (x.ndim - n) + strides, padding
    )
    total = total[(Ellipsis,) + tuple(slice(0, o) for o in outs)]
    if divisor:
        return (total / divisor).astype(x.dtype)
    div = _avg_divisor(sizes, outs, kernel, strides, pads, count_include_pad)
    return (total / jnp.asarray(div, dtype)).astype(x.dtype)


def _avg_pool_lower(
    ctx: NodeContext,
    x: popxl.Tensor,
    n: int,
    kernel_size: Any,
    stride: Any = (),
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> popxl.Tensor:
    kernel = _ints(kernel_size, n)
    strides = _ints(stride, n) or kernel
    pads = _ints(padding, n, 0)
    outs = ctx.out_shape[-n:]
    counts_padding = count_include_pad and any(pads)
    if not counts_padding and not divisor_override:
        out = ops.average_pool(x, kernel, strides, pads * 2, ceil_mode=bool(ceil_mode))
        if tuple(out.shape) == ctx.out_shape:
            return out
    return ctx.jax(
        "avg_pool",
        _avg_pool,
        x,
        kernel=kernel,
        strides=strides,
        pads=pads,
        outs=tuple(outs),
        count_include_pad=bool(count_include_pad),
        divisor=float(divisor_override or 0),
    )


@lowering(aten.avg_pool2d.default)
def _lower_avg_pool2d(ctx: NodeContext, x: popxl.Tensor, *args: Any) -> popxl.Tensor:
    return _avg_pool_lower(ctx, x, 2, *args)


@lowering(aten.avg_pool3d.default)
def _lower_avg_pool3d(ctx: NodeContext, x: popxl.Tensor, *args: Any) -> popxl.Tensor:
    return _avg_pool_lower(ctx, x, 3, *args)


# Adaptive pools -----------------------------------------------------------------------------


def _adaptive_windows(size: int, out: int) -> _Taps:
    """torch's adaptive window of output ``i``: ``[floor(i*size/out), ceil((i+1)*size/out))``,
    padded to the longest with invalid taps."""
    starts = [(i * size) // out for i in range(out)]
    ends = [-((-(i + 1) * size) // out) for i in range(out)]
    longest = max(e - s for s, e in zip(starts, ends))
    rows = [[s + t for t in range(longest)] for s in starts]
    ok = [[1.0 if s + t < e else 0.0 for t in range(longest)] for s, e in zip(starts, ends)]
    return _taps(rows, ok)


def _adaptive_avg(ctx: NodeContext, x: popxl.Tensor, n: int) -> popxl.Tensor:
    lead = x.rank - n
    sizes, outs = x.shape[lead:], ctx.out_shape[lead:]
    axes = []
    for a in range(n):
        rows, ok = _adaptive_windows(sizes[a], outs[a])
        weights = [[v / sum(r) for v in r] for r in ok]
        rows = tuple(tuple(min(i, sizes[a] - 1) for i in r) for r in rows)
        axes.append((lead + a, _taps(rows, weights)))
    return ctx.jax("adaptive_avg_pool", _blend, x, axes_taps=tuple(axes))


@lowering(aten._adaptive_avg_pool2d.default)
def _lower_adaptive_avg_pool2d(ctx: NodeContext, x: popxl.Tensor, output_size: Any) -> Any:
    return _adaptive_avg(ctx, x, 2)


@lowering(aten._adaptive_avg_pool3d.default)
def _lower_adaptive_avg_pool3d(ctx: NodeContext, x: popxl.Tensor, output_size: Any) -> Any:
    return _adaptive_avg(ctx, x, 3)


def _adaptive_max(ctx: NodeContext, x: popxl.Tensor, n: int) -> tuple[popxl.Tensor, ...]:
    sizes, outs = x.shape[-n:], ctx.out_shape[-n:]
    windows = tuple(_adaptive_windows(sizes[a], outs[a]) for a in range(n))
    return ctx.jax("adaptive_max_pool", _window_max, x, windows=windows)


@lowering(aten.adaptive_max_pool2d.default)
def _lower_adaptive_max_pool2d(ctx: NodeContext, x: popxl.Tensor, output_size: Any) -> Any:
    return _adaptive_max(ctx, x, 2)


@lowering(aten.adaptive_max_pool3d.default)
def _lower_adaptive_max_pool3d(ctx: NodeContext, x: popxl.Tensor, output_size: Any) -> Any:
    return _adaptive_max(ctx, x, 3)


# Padding ------------------------------------------------------------------------------------


def _pad_pairs(pad: Sequence[int], rank: int) -> list[tuple[int, int]]:
    """torch's pad list (last axis first, begin/end pairs) as one pair per axis."""
    pairs = [(0, 0)] * rank
    for i in range(len(pad) // 2):
        pairs[rank - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    return pairs


def _constant_pad(x: Any, pairs: tuple[tuple[int, int], ...], value: float) -> Any:
    """``lax.pad``: negative amounts crop, as torch's do."""
    return lax.pad(x, jnp.asarray(value, x.dtype), [(lo, hi, 0) for lo, hi in pairs])


@lowering(aten.constant_pad_nd.default)
def _lower_constant_pad_nd(
    ctx: NodeContext, x: popxl.Tensor, pad: Any, value: Any = 0
) -> popxl.Tensor:
    x = ctx.tensor(x, ctx.out_dtype)
    pairs = tuple(_pad_pairs(pad, x.rank))
    fill = bool(value) if ctx.out_dtype == popxl.bool else float(value)
    return ctx.jax("constant_pad_nd", _constant_pad, x, pairs=pairs, value=fill)


def _np_pad(x: Any, pairs: tuple[tuple[int, int], ...], mode: str) -> Any:
    return jnp.pad(x, pairs, mode=mode)


def _mode_pad(mode: str, what: str) -> Any:
    def lower(ctx: NodeContext, x: popxl.Tensor, pad: Any) -> popxl.Tensor:
        pairs = tuple(_pad_pairs(pad, x.rank))
        if any(p < 0 for pair in pairs for p in pair):
            raise ValueError(f"{what} padding must not be negative; got {list(pad)}.")
        return ctx.jax(f"pad_{mode}", _np_pad, x, pairs=pairs, mode=mode)

    return lower


for _ops, _mode, _what in (
    (
        (
            aten.reflection_pad1d.default,
            aten.reflection_pad2d.default,
            aten.reflection_pad3d.default,
        ),
        "reflect",
        "Reflection",
    ),
    (
        (
            aten.replication_pad1d.default,
            aten.replication_pad2d.default,
            aten.replication_pad3d.default,
        ),
        "edge",
        "Replication",
    ),
    ((aten._pad_circular.default,), "wrap", "Circular"),
):
    lowering(*_ops, preserve=True)(_mode_pad(_mode, _what))


# Upsampling ---------------------------------------------------------------------------------


def _f32(v: Any) -> np.float32:
    return np.float32(v)


def _scale(size: int, out: int, scale: float | None, align_corners: bool = False) -> np.float32:
    """torch's source-per-destination step (``area_pixel_compute_scale``)."""
    if align_corners:
        return _f32((size - 1) / (out - 1)) if out > 1 else _f32(0)
    if scale is not None and scale > 0:
        return _f32(1.0 / scale)
    return _f32(size) / _f32(out)


def _nearest_index(size: int, out: int, scale: float | None, exact: bool) -> tuple[int, ...]:
    step = _scale(size, out, scale)
    dst = np.arange(out, dtype=np.float32) + (_f32(0.5) if exact else _f32(0))
    return tuple(int(v) for v in np.minimum(np.floor(dst * step).astype(np.int64), size - 1))


def _source(size: int, out: int, scale: float | None, align_corners: bool, cubic: bool) -> Any:
    step = _scale(size, out, scale, align_corners)
    dst = np.arange(out, dtype=np.float32)
    if align_corners:
        return dst * step
    src = step * (dst + _f32(0.5)) - _f32(0.5)
    return src if cubic else np.maximum(src, _f32(0))


def _guard(src: Any, size: int) -> tuple[Any, Any]:
    """The input position below each source coordinate and the fraction past it."""
    i0 = np.minimum(np.floor(src).astype(np.int64), size - 1)
    frac = np.clip(src - i0.astype(np.float32), 0, 1).astype(np.float32)
    return i0, frac


def _linear_taps(size: int, out: int, scale: float | None, align_corners: bool) -> _Taps:
    src = _source(size, out, scale, align_corners, cubic=False)
    i0, frac = _guard(src, size)
    i1 = np.minimum(i0 + 1, size - 1)
    return _taps(np.stack([i0, i1], 1), np.stack([_f32(1) - frac, frac], 1))


def _cubic_weights(t: Any, a: float | np.float32 = -0.75) -> Any:
    """Keys' cubic convolution weights of the 4 neighbours at offsets -1, 0, 1, 2."""
    a = _f32(a)

    def near(d: Any) -> Any:  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: Any) -> Any:  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], 1)


def _cubic_taps(size: int, out: int, scale: float | None, align_corners: bool) -> _Taps:
    src = _source(size, out, scale, align_corners, cubic=True)
    i0, t = _guard(src, size)
    idx = np.clip(i0[:, None] + np.arange(-1, 3)[None, :], 0, size - 1)
    return _taps(idx, _cubic_weights(t))


def _aa_linear(x: Any) -> Any:
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0).astype(np.float32)


def _aa_cubic(x: Any) -> Any:
    """The cubic filter of PIL's resampling (``a = -0.5``), which torch's antialiased
    bicubic uses (not the ``a = -0.75`` of its plain bicubic)."""
    a, x = _f32(-0.5), np.abs(x).astype(np.float32)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, near, np.where(x < 2, far, 0)).astype(np.float32)


def _antialias_taps(filter_fn: Any, interp_size: int) -> Any:
    """Taps of torch's antialiased resampling (``antialias=True``): the filter stretched by
    the downsampling factor, so each output averages every input it covers; normalised to
    sum to one. Upsampling uses the filter as is."""

    def taps(size: int, out: int, scale: float | None, align_corners: bool) -> _Taps:
        step = _scale(size, out, scale, align_corners)
        stretch = step if step >= 1 else _f32(1)
        support = _f32(interp_size / 2) * stretch
        width = int(np.ceil(support)) * 2 + 1
        center = step * (np.arange(out, dtype=np.float32) + _f32(0.5))
        low = np.maximum((center - support + _f32(0.5)).astype(np.int64), 0)
        high = np.minimum((center + support + _f32(0.5)).astype(np.int64), size)
        count = np.clip(high - low, 0, width)
        offsets = np.arange(width)[None, :]
        index = low[:, None] + offsets
        inside = offsets < count[:, None]
        w = filter_fn((index - center[:, None] + _f32(0.5)) / stretch) * inside
        total = w.sum(1, keepdims=True)
        w = np.where(total != 0, w / np.where(total != 0, total, 1), 0)
        return _taps(np.where(inside, index, low[:, None]), w)

    return taps


def _upsample_args(n: int, given: tuple) -> list[float | None]:
    """The per-axis scale factors torch passes its kernel (``None``: from the sizes).
    ``.vec`` overloads give one list (or None), the others one optional float per axis."""
    if len(given) == 1 and (given[0] is None or isinstance(given[0], (list, tuple))):
        given = tuple(given[0] or ())
    given = tuple(given) + (None,) * (n - len(given))
    return [None if s is None else float(s) for s in given[:n]]


def _upsample_nearest(exact: bool, n: int) -> Any:
    def lower(
        ctx: NodeContext, x: popxl.Tensor, output_size: Any, *scales: Any, **named: Any
    ) -> Any:
        per_axis = _upsample_args(n, (*scales, *named.values()))
        lead = x.rank - n
        sizes, outs = x.shape[lead:], ctx.out_shape[lead:]
        axes = tuple(
            (lead + a, _nearest_index(sizes[a], outs[a], per_axis[a], exact)) for a in range(n)
        )
        return ctx.jax("upsample_nearest", _select, x, axes_index=axes)

    return lower


def _upsample_interp(taps_of: Any, n: int, name: str) -> Any:
    def lower(
        ctx: NodeContext,
        x: popxl.Tensor,
        output_size: Any,
        align_corners: bool,
        *scales: Any,
        **named: Any,
    ) -> Any:
        per_axis = _upsample_args(n, (*scales, *named.values()))
        lead = x.rank - n
        sizes, outs = x.shape[lead:], ctx.out_shape[lead:]
        axes = tuple(
            (lead + a, taps_of(sizes[a], outs[a], per_axis[a], bool(align_corners)))
            for a in range(n)
        )
        return ctx.jax(name, _blend, x, axes_taps=axes)

    return lower


for _n, _vec, _default, _exact_vec, _exact_default in (
    (
        1,
        aten.upsample_nearest1d.vec,
        aten.upsample_nearest1d.default,
        aten._upsample_nearest_exact1d.vec,
        aten._upsample_nearest_exact1d.default,
    ),
    (
        2,
        aten.upsample_nearest2d.vec,
        aten.upsample_nearest2d.default,
        aten._upsample_nearest_exact2d.vec,
        aten._upsample_nearest_exact2d.default,
    ),
    (
        3,
        aten.upsample_nearest3d.vec,
        aten.upsample_nearest3d.default,
        aten._upsample_nearest_exact3d.vec,
        aten._upsample_nearest_exact3d.default,
    ),
):
    lowering(_vec, _default, preserve=True)(_upsample_nearest(False, _n))
    lowering(_exact_vec, _exact_default, preserve=True)(_upsample_nearest(True, _n))

for _targets, _taps_of, _n, _name in (
    (
        (aten.upsample_linear1d.vec, aten.upsample_linear1d.default),
        _linear_taps,
        1,
        "upsample_linear",
    ),
    ((aten.upsample_bilinear2d.vec,), _linear_taps, 2, "upsample_linear"),
    (
        (aten.upsample_trilinear3d.vec, aten.upsample_trilinear3d.default),
        _linear_taps,
        3,
        "upsample_linear",
    ),
    ((aten.upsample_bicubic2d.vec,), _cubic_taps, 2, "upsample_cubic"),
    (
        (aten._upsample_bilinear2d_aa.vec, aten._upsample_bilinear2d_aa.default),
        _antialias_taps(_aa_linear, 2),
        2,
        "upsample_linear_aa",
    ),
    (
        (aten._upsample_bicubic2d_aa.vec, aten._upsample_bicubic2d_aa.default),
        _antialias_taps(_aa_cubic, 4),
        2,
        "upsample_cubic_aa",
    ),
):
    lowering(*_targets, preserve=True)(_upsample_interp(_taps_of, _n, _name))


# Grid sampling ------------------------------------------------------------------------------

# torch's enumerations of grid_sample's modes (``GridSamplerInterpolation``, ``GridSamplerPadding``)
_GRID_MODES: tuple[Literal["bilinear", "nearest", "bicubic"], ...] = (
    "bilinear",
    "nearest",
    "bicubic",
)
_GRID_PADDING: tuple[Literal["zeros", "border", "reflection"], ...] = (
    "zeros",
    "border",
    "reflection",
)


@lowering(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def _lower_grid_sampler(
    ctx: NodeContext,
    x: popxl.Tensor,
    grid: popxl.Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> popxl.Tensor:
    mode, padding = _GRID_MODES[interpolation_mode], _GRID_PADDING[padding_mode]
    return ops.grid_sample(x, grid, mode, padding, bool(align_corners))


# Embeddings ---------------------------------------------------------------------------------


def _embedding(weight: Any, indices: Any, padding_idx: int, scale_grad_by_freq: bool) -> Any:
    """``weight[indices]``; the ``padding_idx`` row gets no gradient, and with
    ``scale_grad_by_freq`` each row's gradient is divided by how often it was read."""
    rows = jnp.take(weight, indices, axis=0)
    fixed = lax.stop_gradient(rows)
    if scale_grad_by_freq:
        flat = indices.reshape(-1)
        counts = (flat[:, None] == flat[None, :]).sum(1).reshape(indices.shape)
        rows = fixed + (rows - fixed) / counts[..., None].astype(rows.dtype)
    if padding_idx >= 0:
        rows = jnp.where((indices == padding_idx)[..., None], fixed, rows)
    return rows


@lowering(aten.embedding.default)
def _lower_embedding(
    ctx: NodeContext,
    weight: popxl.Tensor,
    indices: popxl.Tensor,
    padding_idx: int = -1,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> popxl.Tensor:
    if padding_idx < 0 and not scale_grad_by_freq:
        return ops.gather(weight, indices, axis=0)
    return ctx.jax(
        "embedding",
        _embedding,
        weight,
        indices,
        nondiff=(1,),
        padding_idx=int(padding_idx),
        scale_grad_by_freq=bool(scale_grad_by_freq),
    )


_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}


def _embedding_bag(
    weight: Any,
    indices: Any,
    offsets: Any,
    *per_sample: Any,
    mode: int,
    bags: int,
    include_last_offset: bool,
    padding_idx: int,
) -> Any:
    """Bag ``b`` pools the rows of ``indices[offsets[b]:offsets[b + 1]]`` (the last bag runs
    to the end, or to the last offset with ``include_last_offset``); an empty bag is 0."""
    n = indices.shape[0]
    pos = jnp.arange(n)
    bag = jnp.searchsorted(offsets, pos, side="right") - 1
    keep = bag >= 0
    if include_last_offset:
        keep &= pos < offsets[-1]
    if padding_idx >= 0:
        keep &= indices != padding_idx
    segment = jnp.where(keep, bag, bags)  # dropped rows go to an extra bag
    rows = jnp.take(weight, indices, axis=0)
    if per_sample:
        rows = rows * per_sample[0][:, None].astype(rows.dtype)
    if mode == 2:
        out = jax.ops.segment_max(rows, segment, num_segments=bags + 1)[:bags]
        return jnp.where(jnp.isneginf(out), jnp.zeros_like(out), out)
    out = jax.ops.segment_sum(rows, segment, num_segments=bags + 1)[:bags]
    if mode == 1:
        count = jax.ops.segment_sum(keep.astype(rows.dtype), segment, num_segments=bags + 1)
        out = out / jnp.maximum(count[:bags], 1)[:, None]
    return out


def _lower_embedding_bag(
    ctx: NodeContext,
    weight: popxl.Tensor,
    indices: popxl.Tensor,
    offsets: popxl.Tensor,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: popxl.Tensor | None = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
) -> tuple:
    """Only the pooled rows: the other outputs (bag of each index, bag sizes, the rows
    that won each max) are torch's backward's and nothing in a forward reads them."""
    if scale_grad_by_freq:
        raise NotImplementedError("embedding_bag: scale_grad_by_freq=True is not supported.")
    if mode not in _BAG_MODES:
        raise ValueError(
            f"embedding_bag: unknown mode {mode}; expected 0 (sum), 1 (mean), 2 (max)."
        )
    for i in (1, 2, 3):
        if ctx.output_used(i):
            raise NotImplementedError(
                f"embedding_bag: output {i} (offset2bag, bag_size, max_indices) is not "
                "supported; only the pooled rows are."
            )
    extra = [] if per_sample_weights is None else [ctx.tensor(per_sample_weights, weight.dtype)]
    pooled = ctx.jax(
        "embedding_bag",
        _embedding_bag,
        weight,
        indices,
        offsets,
        *extra,
        outputs=[ctx.out_spec(0)],
        nondiff=(1, 2),
        mode=int(mode),
        bags=ctx.out_shape[0],
        include_last_offset=bool(include_last_offset),
        padding_idx=-1 if padding_idx is None else int(padding_idx),
    )
    return pooled, None, None, None


lowering(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)(
    _lower_embedding_bag
)
