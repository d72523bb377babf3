"""Resampling ops: ``interpolate`` (ONNX ``Resize``), ``roi_align`` (ONNX ``RoiAlign``) and
``grid_sample`` (ONNX ``GridSample``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from .. import context, dtypes
from .._op import core_error, define
from ..tensor import Tensor
from ._base import check_in_graph, jnp, lax, record, same_dtype, spec
from .nn import FLOATS, _check_choice, _compute_type

# Resize ----------------------------------------------------------------------------------

INTERPOLATE_MODES = ("nearest", "linear", "cubic")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
COORDINATE_MODES = (
    "half_pixel",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
NEAREST_ROUNDING: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "round_prefer_floor": lambda c: np.ceil(c - 0.5),
    "round_prefer_ceil": lambda c: np.floor(c + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}
CUBIC_A = -0.75  # ONNX's default cubic_coeff_a


def _resized_shape(shape: tuple, scale_factor: tuple) -> tuple[int, ...]:
    if len(scale_factor) != len(shape):
        raise core_error(
            f"interpolate: scale_factor needs one value per axis of the input "
            f"{shape}, got {scale_factor}."
        )
    # float32 arithmetic, as the original's (its scales are float32)
    out = tuple(math.floor(np.float32(d) * np.float32(s)) for d, s in zip(shape, scale_factor))
    if any(o < 1 for o in out):
        raise core_error(
            f"interpolate: scale_factor {scale_factor} shrinks the input {shape} "
            f"to the empty shape {out}."
        )
    return out


def _source_coords(out_len: int, in_len: int, scale: float, mode: str) -> np.ndarray:
    """Input coordinate of each output position along one axis (ONNX Resize, in float32).

    ``size``, the unrounded output length ``in_len * scale``, is what ``align_corners``
    and ``tf_crop_and_resize`` stretch over (as the ONNX reference and the original do).
    """
    f = np.float32
    x, scale32 = np.arange(out_len, dtype=f), f(scale)
    size = f(in_len) * scale32
    if mode == "asymmetric":
        return x / scale32
    if mode in ("align_corners", "tf_crop_and_resize"):  # the latter with the whole-input roi
        if size == 1:
            return np.full(out_len, 0.0 if mode == "align_corners" else (in_len - 1) / 2, f)
        return x * f(in_len - 1) / (size - 1)
    if mode == "pytorch_half_pixel" and size <= 1:
        return np.zeros(out_len, f)
    return (x + f(0.5)) / scale32 - f(0.5)


def _keys_cubic(r: Any) -> tuple[Any, Any, Any, Any]:
    """Keys cubic weights of the taps at offsets -1, 0, 1, 2 from ``floor(coordinate)``,
    ``r`` being the fraction past it (NumPy or JAX arrays)."""
    a = CUBIC_A

    def near(d: Any) -> Any:  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: Any) -> Any:  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return far(r + 1), near(r), near(1 - r), far(2 - r)


def _resize_taps(
    out_len: int, in_len: int, scale: float, mode: str, nearest_mode: str, coordinate_mode: str
) -> tuple[np.ndarray, np.ndarray]:
    """Input indices and weights, each ``(taps, out_len)``, of one axis; edges clamp."""
    coords = _source_coords(out_len, in_len, scale, coordinate_mode)
    if mode == "nearest":
        index = NEAREST_ROUNDING[nearest_mode](coords)[None]
        weights = np.ones_like(index)
    else:
        base = np.floor(coords)
        frac = coords - base
        offsets = (0, 1) if mode == "linear" else (-1, 0, 1, 2)
        index = base[None] + np.array(offsets, np.float64)[:, None]
        weights = np.stack([1 - frac, frac] if mode == "linear" else _keys_cubic(frac))
    return np.clip(index, 0, in_len - 1).astype(np.int32), weights


def _interpolate_infer(t: Any, *, scale_factor: tuple, **_: Any) -> list:
    return [spec(_resized_shape(t.shape, scale_factor), t.dtype)]


def _lower_interpolate(
    x: Any,
    *,
    scale_factor: tuple,
    mode: str,
    nearest_mode: str,
    coordinate_transformation_mode: str,
) -> Any:
    y = x if mode == "nearest" else x.astype(_compute_type(x))
    out_shape = _resized_shape(x.shape, scale_factor)
    for axis, (d, s, o) in enumerate(zip(x.shape, scale_factor, out_shape)):
        if s == 1.0 and o == d:
            continue  # every mode maps an unscaled axis onto itself
        index, weights = _resize_taps(o, d, s, mode, nearest_mode, coordinate_transformation_mode)
        if mode == "nearest":
            y = jnp.take(y, index[0], axis=axis)
            continue
        shape = [1] * x.ndim
        shape[axis] = o
        taps = [
            jnp.take(y, i, axis=axis) * jnp.asarray(w, y.dtype).reshape(shape)
            for i, w in zip(index, weights)
        ]
        y = sum(taps[1:], taps[0])
    return y.astype(x.dtype)


INTERPOLATE = define("interpolate", "Resize", _interpolate_infer, _lower_interpolate)


def interpolate(
    t: Tensor,
    scale_factor: tuple[float, ...] | None = (1.0, 1.0, 1.0, 1.0),
    mode: Literal["nearest", "linear", "cubic"] | None = "nearest",
    nearest_mode: Literal["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
    | None = "round_prefer_floor",
    coordinate_transformation_mode: Literal[
        "half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"
    ]
    | None = "half_pixel",
) -> Tensor:
    """ONNX ``Resize`` by per-axis scale factors: ``out_dim = floor(in_dim * scale)``.

    ``scale_factor`` has one entry per axis of ``t`` (the default suits 4-D inputs). Each
    output position ``x`` maps to the input coordinate given by
    ``coordinate_transformation_mode`` (``scale`` being the given factor):

    * ``half_pixel``: ``(x + 0.5) / scale - 0.5``;
    * ``pytorch_half_pixel``: the same, but 0 when ``in * scale <= 1``;
    * ``align_corners``: ``x * (in - 1) / (in * scale - 1)`` (0 when ``in * scale == 1``);
    * ``asymmetric``: ``x / scale``;
    * ``tf_crop_and_resize``: with the whole input as region of interest (this signature
      has no roi), as ``align_corners`` but ``(in - 1) / 2`` when ``in * scale == 1``.

    ``mode`` ``nearest`` rounds that coordinate by ``nearest_mode``; ``linear`` blends the
    two neighbours; ``cubic`` uses Keys' cubic convolution with ``a = -0.75`` over four
    neighbours (ONNX's defaults, neighbours beyond the edges repeat the edge value). Axes
    are resized one after another (linear is bilinear/trilinear on several axes). Sizes
    and coordinates are computed in float32, as in the original; float16 data is blended
    in float32.

    Returns:
        The resized tensor, named ``interpolate_out``.

    Raises:
        ValueError: an unknown ``mode``, ``nearest_mode`` or
            ``coordinate_transformation_mode``, or a non-positive scale.
        PopXLException: a ``scale_factor`` of the wrong length, or an empty output.

    See also ``torch.nn.functional.interpolate``.
    """
    check_in_graph(context.get_current_graph(), t=t)
    mode = _check_choice(
        mode or "nearest",
        INTERPOLATE_MODES,
        "interpolate type {!r} is not valid, must be nearest, linear or cubic.",
    )
    nearest_mode = _check_choice(
        nearest_mode or "round_prefer_floor",
        NEAREST_MODES,
        "nearest mode {!r} is not valid, must be round_prefer_floor, round_prefer_ceil, "
        "floor or ceil.",
    )
    coordinate_mode = _check_choice(
        coordinate_transformation_mode or "half_pixel",
        COORDINATE_MODES,
        "coordinate transformation mode {!r} is not valid, must be half_pixel, "
        "pytorch_half_pixel, align_corners, asymmetric or tf_crop_and_resize.",
    )
    scales = tuple(float(s) for s in (scale_factor or ()))
    if any(not s > 0 for s in scales):
        raise ValueError(f"interpolate: scale factors must be positive, got {scales}.")
    attrs = {
        "scale_factor": scales,
        "mode": mode,
        "nearest_mode": nearest_mode,
        "coordinate_transformation_mode": coordinate_mode,
    }
    return record(INTERPOLATE, {"t": t}, attrs, ["interpolate_out"])[0]


# RoIAlign --------------------------------------------------------------------------------


def _roi_align_infer(
    t: Any,
    rois: Any,
    batch_index: Any,
    *,
    output_size: tuple,
    spatial_scale: float,
    sampling_ratio: int,
) -> list:
    if len(t.shape) != 4:
        raise core_error(f"roi_align: the input must be (N, C, H, W), got shape {t.shape}.")
    if len(rois.shape) != 2 or rois.shape[1] != 4:
        raise core_error(
            f"roi_align: rois must be (num_rois, 4) boxes [x1, y1, x2, y2], got shape {rois.shape}."
        )
    if batch_index.shape != rois.shape[:1]:
        raise core_error(
            f"roi_align: batch_index must be ({rois.shape[0]},), one image index "
            f"per roi, got shape {batch_index.shape}."
        )
    if batch_index.dtype != dtypes.int32:
        raise core_error(f"roi_align: batch_index must be int32, got {batch_index.dtype.name}.")
    dt = same_dtype("RoiAlign", t, rois)
    if dt not in FLOATS:
        raise core_error(f"roi_align: t and rois must be float16 or float32, got {dt.name}.")
    return [spec((rois.shape[0], t.shape[1], *output_size), dt)]


def _bilinear_weights(pos: Any, length: int) -> Any:
    """``(..., length)`` weights of bilinear sampling at ``pos`` (torchvision's edge rules)."""
    inside = (pos >= -1.0) & (pos <= length)
    pos = jnp.maximum(pos, 0.0)
    low = jnp.floor(pos).astype(jnp.int32)
    at_end = low >= length - 1
    low = jnp.where(at_end, length - 1, low)
    high = jnp.where(at_end, length - 1, low + 1)
    frac = jnp.where(at_end, 0.0, pos - low)[..., None]
    cells = jnp.arange(length)
    w = (1 - frac) * (cells == low[..., None]) + frac * (cells == high[..., None])
    return jnp.where(inside[..., None], w, 0.0)


def _roi_axis_weights(start: Any, end: Any, bins: int, sampling_ratio: int, length: int) -> Any:
    """``(R, bins, length)``: each bin's bilinear weights averaged over its sample points."""
    bin_size = jnp.maximum(end - start, 1.0) / bins
    if sampling_ratio > 0:
        grid = jnp.full(start.shape, sampling_ratio, jnp.int32)
        count: Any = sampling_ratio
    else:  # adaptive: ceil(bin size) samples per bin, a different number per roi
        grid = jnp.ceil(bin_size).astype(jnp.int32)
        count = jnp.max(grid, initial=0)
    first = start[:, None] + jnp.arange(bins) * bin_size[:, None]
    step = (bin_size / grid)[:, None]

    def add_sample(i: Any, total: Any) -> Any:
        w = _bilinear_weights(first + (i + 0.5) * step, length)
        return total + jnp.where((i < grid)[:, None, None], w, 0.0)

    total = lax.fori_loop(
        0, count, add_sample, jnp.zeros((*start.shape, bins, length), start.dtype)
    )
    return total / grid[:, None, None]


def _lower_roi_align(
    x: Any,
    rois: Any,
    batch_index: Any,
    *,
    output_size: tuple,
    spatial_scale: float,
    sampling_ratio: int,
) -> Any:
    f = _compute_type(x)
    # Boxes get no gradient (as in the original), which also keeps the adaptive sampling
    # loop out of reverse-mode differentiation.
    boxes = lax.stop_gradient(rois).astype(f) * spatial_scale
    (out_h, out_w), (h, w) = output_size, x.shape[2:]
    wy = _roi_axis_weights(boxes[:, 1], boxes[:, 3], out_h, sampling_ratio, h)
    wx = _roi_axis_weights(boxes[:, 0], boxes[:, 2], out_w, sampling_ratio, w)
    images = jnp.take(x.astype(f), batch_index, axis=0)
    out = jnp.einsum("rph,rchw,rqw->rcpq", wy, images, wx, precision=lax.Precision.HIGHEST)
    return out.astype(x.dtype)


ROI_ALIGN = define(
    "roi_align", "RoiAlign", _roi_align_infer, _lower_roi_align, nondiff_inputs=(1, 2)
)


def roi_align(
    t: Tensor,
    rois: Tensor,
    batch_index: Tensor,
    output_size: tuple[int, ...],
    spatial_scale: float,
    sampling_ratio: int,
) -> Tensor:
    """Average RoIAlign (Mask R-CNN) of boxes over an ``(N, C, H, W)`` feature map.

    Each box ``rois[r] = [x1, y1, x2, y2]`` (input-image coordinates, scaled by
    ``spatial_scale``) on image ``batch_index[r]`` is split into an ``output_size`` grid of
    bins; each bin averages bilinear samples at a ``sampling_ratio`` x ``sampling_ratio``
    grid of points (``sampling_ratio <= 0``: ``ceil(bin size)`` points per axis, chosen per
    box). Semantics of torchvision's ``roi_align(..., aligned=False)``: boxes are at least
    one pixel wide and high, samples more than one pixel outside the map count as 0 and
    coordinates are not shifted by half a pixel. Gradients flow to ``t`` only.

    Args:
        t: feature map ``(N, C, H, W)``.
        rois: boxes ``(R, 4)`` of ``t``'s dtype.
        batch_index: int32 ``(R,)``, the image of each box.
        output_size: ``(out_h, out_w)``.
        spatial_scale: factor from box coordinates to feature-map coordinates.
        sampling_ratio: sample points per bin along each axis.

    Returns:
        ``(R, C, out_h, out_w)``, named ``roi_align_out``.

    Raises:
        ValueError: an ``output_size`` that is not two positive ints.
        PopXLException: inputs of the wrong ranks, shapes or dtypes.
    """
    size = tuple(int(s) for s in output_size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(
            f"roi_align: output_size must be two positive ints (out_h, out_w), "
            f"got {tuple(output_size)}."
        )
    attrs = {
        "output_size": size,
        "spatial_scale": float(spatial_scale),
        "sampling_ratio": int(sampling_ratio),
    }
    inputs = {"t": t, "rois": rois, "batch_index": batch_index}
    return record(ROI_ALIGN, inputs, attrs, ["roi_align_out"])[0]


# GridSample ------------------------------------------------------------------------------

GRID_SAMPLE_MODES = ("bilinear", "nearest", "bicubic")
GRID_PADDING_MODES = ("zeros", "border", "reflection")
GRID_SHAPE_MSG = (
    "grid_sample: expected an input (N, C, *spatial) and a grid (N, *out_spatial, k) with one "
    "coordinate per spatial axis (k = {k}, x first), got shapes {t} and {grid}."
)


def _grid_sample_infer(t: Any, grid: Any, **_: Any) -> list:
    k = len(t.shape) - 2
    if k < 1 or len(grid.shape) != k + 2 or grid.shape[-1] != k or grid.shape[0] != t.shape[0]:
        raise core_error(GRID_SHAPE_MSG.format(k=k, t=t.shape, grid=grid.shape))
    dt = same_dtype("GridSample", t, grid)
    if dt not in FLOATS:
        raise core_error(f"grid_sample: t and grid must be float16 or float32, got {dt.name}.")
    return [spec((*t.shape[:2], *grid.shape[1:-1]), dt)]


def _unnormalize(g: Any, size: int, align_corners: bool) -> Any:
    """Grid coordinate in [-1, 1] -> pixel coordinate (-1, 1: the corner pixels' centres
    with ``align_corners``, their outer edges without)."""
    if align_corners:
        return (g + 1) / 2 * (size - 1)
    return ((g + 1) * size - 1) / 2


def _clip(c: Any, size: int) -> Any:
    # where, not clip: torch's gradient is 0 on the borders themselves, not only beyond.
    return jnp.where(c <= 0, 0.0, jnp.where(c >= size - 1, size - 1.0, c)).astype(c.dtype)


def _reflect(c: Any, twice_low: int, twice_high: int) -> Any:
    """``c`` reflected off the bounds ``[twice_low / 2, twice_high / 2]`` until inside."""
    if twice_low == twice_high:
        return jnp.zeros_like(c)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    d = jnp.abs(c - low)
    extra = jnp.fmod(d, span)
    flips = jnp.floor(d / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _pad_coordinate(c: Any, size: int, padding_mode: str, align_corners: bool) -> Any:
    """Where a pixel coordinate reads under ``padding_mode`` (``zeros``: itself; out of
    range it reads 0)."""
    if padding_mode == "border":
        return _clip(c, size)
    if padding_mode == "reflection":
        twice = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        return _clip(_reflect(c, *twice), size)
    return c


def _axis_taps(g: Any, size: int, mode: str, padding_mode: str, align_corners: bool) -> list:
    """The ``(position, weight)`` taps one axis of each output point reads."""
    c = _unnormalize(g, size, align_corners)
    if mode == "nearest":
        # jnp.round rounds half to even, as torch's nearbyint
        return [(jnp.round(_pad_coordinate(c, size, padding_mode, align_corners)), 1.0)]
    if mode == "bilinear":
        c = _pad_coordinate(c, size, padding_mode, align_corners)
        low = jnp.floor(c)
        return [(low, low + 1 - c), (low + 1, c - low)]
    # bicubic pads each tap, not the coordinate
    low = jnp.floor(c)
    return [
        (_pad_coordinate(low + (k - 1), size, padding_mode, align_corners), w)
        for k, w in enumerate(_keys_cubic(c - low))
    ]


def _gather_points(x: Any, index: list) -> Any:
    """``x`` ``(N, C, *spatial)`` at the integer points ``index`` (one ``(T, N, *out)``
    array per spatial axis, T taps per output point): ``(N, C, T, prod(out))``. One gather
    for every tap, so the gradient is one scatter-add (16 of each for a 2-D bicubic sample
    took XLA:CPU 7 s to compile)."""
    n, c, *sizes = x.shape
    flat = index[0]
    for i, s in zip(index[1:], sizes[1:]):
        flat = flat * s + i
    taps = flat.shape[0]
    flat = jnp.moveaxis(flat.reshape(taps, n, -1), 0, 1).reshape(n, 1, -1)
    flat = jnp.broadcast_to(flat, (n, c, flat.shape[-1]))
    picked = jnp.take_along_axis(x.reshape(n, c, -1), flat, axis=2)
    return picked.reshape(n, c, taps, -1)


def _stacked_taps(per_axis: list, sizes: tuple, lead: tuple) -> tuple[list, Any]:
    """Every combination of the axes' taps, as a leading tap axis: the clipped integer
    position on each axis ``(T, *lead)`` and the weight ``(T, *lead)``, 0 where the tap
    falls outside the input."""
    k = len(per_axis)
    index, weight = [], None
    inside = None
    for a, (taps, s) in enumerate(zip(per_axis, sizes)):
        # axis a's taps along tap axis a of k, broadcast over the others
        shape = [1] * k
        shape[a] = len(taps)
        pos = jnp.stack([jnp.broadcast_to(p, lead) for p, _ in taps]).reshape(*shape, *lead)
        w = jnp.stack([jnp.broadcast_to(jnp.asarray(v, pos.dtype), lead) for _, v in taps])
        w = w.reshape(*shape, *lead)
        ok = (pos >= 0) & (pos <= s - 1)
        inside = ok if inside is None else inside & ok
        weight = w if weight is None else weight * w
        index.append(jnp.clip(pos, 0, s - 1).astype(jnp.int32))
    full = (*(len(t) for t in per_axis), *lead)
    index = [jnp.broadcast_to(i, full).reshape(-1, *lead) for i in index]
    weight = jnp.where(inside, weight, 0.0)
    return index, jnp.broadcast_to(weight, full).reshape(-1, *lead)


def _lower_grid_sample(
    x: Any, grid: Any, *, mode: str, padding_mode: str, align_corners: bool
) -> Any:
    f = _compute_type(x)
    xs, g = x.astype(f), grid.astype(f)
    sizes = x.shape[2:]
    k = len(sizes)
    # grid[..., 0] is x, the last spatial axis
    per_axis = [
        _axis_taps(g[..., k - 1 - a], sizes[a], mode, padding_mode, align_corners) for a in range(k)
    ]
    index, weight = _stacked_taps(per_axis, sizes, grid.shape[:-1])
    n = x.shape[0]
    weight = jnp.moveaxis(weight.reshape(weight.shape[0], n, -1), 0, 1)[:, None]
    out = (_gather_points(xs, index) * weight).sum(axis=2)
    return out.reshape(*x.shape[:2], *grid.shape[1:-1]).astype(x.dtype)


GRID_SAMPLE = define("grid_sample", "GridSample", _grid_sample_infer, _lower_grid_sample)


def grid_sample(
    t: Tensor,
    grid: Tensor,
    mode: Literal["bilinear", "nearest", "bicubic"] = "bilinear",
    padding_mode: Literal["zeros", "border", "reflection"] = "zeros",
    align_corners: bool = False,
) -> Tensor:
    """Sample ``t`` ``(N, C, *spatial)`` at the points of ``grid`` ``(N, *out, k)``.

    ``grid[n, ...]`` holds one point in normalised coordinates, x (the last spatial axis)
    first: -1 and 1 are the centres of the corner pixels with ``align_corners``, their
    outer edges without. The output ``(N, C, *out)`` is ``t[n]`` at each point:

    * ``bilinear``: a blend of the 2^k neighbouring pixels (trilinear for 3-D inputs);
    * ``nearest``: the nearest pixel (halves round to even);
    * ``bicubic``: Keys' cubic convolution (``a = -0.75``) over 4^k neighbours.

    Points outside the input read 0 (``zeros``), the nearest edge pixel (``border``), or
    the input reflected off its edges (``reflection``: off the corner pixels' centres with
    ``align_corners``, their edges without). Gradients flow to ``t`` and ``grid`` (none to
    ``grid`` from ``nearest``, nor across a border); float16 data is blended in float32.

    Args:
        t: the input, float16 or float32, with at least one spatial axis.
        grid: the sample points, of ``t``'s dtype.
        mode: ``bilinear``, ``nearest`` or ``bicubic``.
        padding_mode: ``zeros``, ``border`` or ``reflection``.
        align_corners: whether -1 and 1 are the corner pixels' centres.

    Returns:
        ``(N, C, *out)``, named ``grid_sample_out``.

    Raises:
        ValueError: an unknown ``mode`` or ``padding_mode``.
        PopXLException: shapes that do not match, or non-float dtypes.

    See also ``torch.nn.functional.grid_sample``.
    """
    check_in_graph(context.get_current_graph(), t=t, grid=grid)
    mode = _check_choice(
        mode,
        GRID_SAMPLE_MODES,
        "grid_sample mode {!r} is not valid, must be bilinear, nearest or bicubic.",
    )
    padding_mode = _check_choice(
        padding_mode,
        GRID_PADDING_MODES,
        "grid_sample padding mode {!r} is not valid, must be zeros, border or reflection.",
    )
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": bool(align_corners)}
    return record(GRID_SAMPLE, {"t": t, "grid": grid}, attrs, ["grid_sample_out"])[0]
