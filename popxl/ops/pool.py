"""Pooling ops: ``average_pool`` and ``max_pool`` (ONNX ``AveragePool`` / ``MaxPool``)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from .. import context
from .._op import define
from ..tensor import Tensor
from ._base import _LazyModule, check_in_graph, jnp, lax, record, spec
from ._spatial import (
    BAD_PAD_TYPE_MSG,
    PAD_TYPES,
    PadType,
    _check_spatial_rank,
    _nonempty,
    _per_axis,
    _window,
)
from .nn import _check_choice, _compute_type

# The lowering's window maxima and sums (and their gradients): imported on first lowering.
_forms: Any = _LazyModule("runtime.backend.pool_forms")

# Pooling ---------------------------------------------------------------------------------


def _pool_windows(
    op: str,
    x: tuple,
    *,
    kernel_size: tuple,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    in_dilations: tuple,
    auto_pad: str,
    ceil_mode: bool,
    **_: Any,
) -> list:
    k = len(x) - 2
    windows = [
        _window(
            (x[2 + i] - 1) * in_dilations[i] + 1,
            kernel_size[i],
            stride[i],
            dilation[i],
            padding[i],
            padding[k + i],
            auto_pad,
            ceil_mode,
        )
        for i in range(k)
    ]
    return _nonempty(op, windows, x[2:], kernel_size, dilation)


def _pool_infer(op: str) -> Any:
    def infer(t: Any, **attrs: Any) -> list:
        windows = _pool_windows(op, t.shape, **attrs)
        pads, k = attrs["out_pads"], len(t.shape) - 2
        out = [o + pads[i] + pads[k + i] for i, (*_, o) in enumerate(windows)]
        return [spec((*t.shape[:2], *out), t.dtype)]

    return infer


def _pool(x: Any, fill: Any, form: str, attrs: dict) -> Any:
    """Reduce every window of ``x``; padding and input-dilation holes hold ``fill``."""
    windows = _pool_windows("pool", x.shape, **attrs)
    config, kernel, stride = [(0, 0, 0)] * 2, [], []
    for i, (lo, _, out) in enumerate(windows):
        gap, k = attrs["in_dilations"][i], attrs["kernel_size"][i]
        s, d = attrs["stride"][i], attrs["dilation"][i]
        first, k = _live_taps(lo, (x.shape[2 + i] - 1) * gap + 1, out, k, s, d)
        s = s if out > 1 else k  # one window: any stride, and one that tiles is cheapest
        last = (out - 1) * s + (k - 1) * d + 1  # the extent the windows read, from `first`
        lo -= first * d
        config.append((lo, last - lo - (x.shape[2 + i] - 1) * gap - 1, gap - 1))
        kernel.append(k)
        stride.append(s)
    padded = lax.pad(x, jnp.asarray(fill, x.dtype), config)
    reduce = getattr(_forms, form)
    out = reduce(padded, tuple(kernel), tuple(stride), attrs["dilation"])
    k, pads = x.ndim - 2, attrs["out_pads"]
    out_config = [(0, 0, 0)] * 2 + [(pads[i], pads[k + i], 0) for i in range(k)]
    return lax.pad(out, jnp.zeros((), x.dtype), out_config)


def _live_taps(lo: int, n: int, out: int, k: int, s: int, d: int) -> tuple[int, int]:
    """(first, count): the run of a window's taps that reads the input (length ``n`` after
    ``lo`` of padding) in some window; the taps outside it read only padding, which holds
    the reduction's identity. A pool whose kernel outsizes its input (EfficientNet's final
    ``AvgPool2d(hidden_dim, ceil_mode=True)``: a 2560-wide window over a 2x2 map) then pads
    and reads the input's extent, not the kernel's."""
    first = max(0, -(-(lo - (out - 1) * s) // d))
    last = min(k - 1, (lo + n - 1) // d)
    return (first, last - first + 1) if last >= first else (0, k)


def _counts(shape: tuple, attrs: dict) -> np.ndarray:
    """How many input elements (not padding, not input-dilation holes) each window holds."""
    windows = _pool_windows("pool", shape, **attrs)
    counts = np.ones((), np.float32)
    for n, (lo, hi, out), k, s, d, gap in zip(
        shape[2:],
        windows,
        attrs["kernel_size"],
        attrs["stride"],
        attrs["dilation"],
        attrs["in_dilations"],
    ):
        # Real elements of the padded axis, then the number each window covers.
        real = np.zeros(lo + (n - 1) * gap + 1 + max(hi, 0), np.float32)
        real[lo : lo + (n - 1) * gap + 1 : gap] = 1
        taps = np.arange(k) * d
        covered = np.array([real[o * s + taps].sum() for o in range(out)], np.float32)
        counts = np.multiply.outer(counts, covered)
    return counts


def _lower_average_pool(x: Any, **attrs: Any) -> Any:
    f = _compute_type(x)
    sums = _pool(x.astype(f), 0, "window_sum", attrs)
    counts = np.maximum(_counts(x.shape, attrs), 1)
    k, pads = x.ndim - 2, attrs["out_pads"]
    counts = np.pad(counts, [(pads[i], pads[k + i]) for i in range(k)], constant_values=1)
    return (sums / jnp.asarray(counts, f)).astype(x.dtype)


def _lower_max_pool(x: Any, storage_order: str, **attrs: Any) -> Any:
    lowest = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    return _pool(x, lowest, "window_max", attrs)


AVERAGE_POOL = define(
    "average_pool", "AveragePool", _pool_infer("average_pool"), _lower_average_pool
)
MAX_POOL = define("max_pool", "MaxPool", _pool_infer("max_pool"), _lower_max_pool)


def _pool_attrs(
    op: str,
    t: Tensor,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    out_pads: Any,
    dilation: Any,
    in_dilations: Any,
    auto_pad: Any,
    ceil_mode: Any,
) -> dict:
    _check_spatial_rank(op, t)
    if not kernel_size:
        raise ValueError(f"{op}: kernel_size is required (one size per spatial axis).")
    return {
        "kernel_size": _per_axis(op, kernel_size, t.shape, "kernel_size", 1),
        "stride": _per_axis(op, stride, t.shape, "stride", 1),
        "padding": _per_axis(op, padding, t.shape, "padding", 0, pairs=True, minimum=0),
        "out_pads": _per_axis(op, out_pads, t.shape, "out_pads", 0, pairs=True, minimum=0),
        "dilation": _per_axis(op, dilation, t.shape, "dilation", 1),
        "in_dilations": _per_axis(op, in_dilations, t.shape, "in_dilations", 1),
        "auto_pad": _check_choice(auto_pad or "not_set", PAD_TYPES, BAD_PAD_TYPE_MSG),
        "ceil_mode": bool(ceil_mode),
    }


POOL_DOC = """
    ``t`` is ``(N, C, *spatial)`` with 1, 2 or 3 spatial axes. Per axis, the window has
    ``kernel_size`` elements spaced ``dilation`` apart and moves by ``stride`` (default 1);
    ``padding`` lists all begins then all ends (default 0). The output size is
    ``floor_or_ceil((in + pad_begin + pad_end - ((k - 1) * dilation + 1)) / stride) + 1``,
    rounding up with ``ceil_mode`` (a last window that would start in the end padding is
    dropped, as in torch and ONNX). ``auto_pad`` works as ``conv``'s ``pad_type``.
    ``in_dilations`` spaces the input elements apart (the holes count as padding);
    ``out_pads`` adds zeros around the output (begins then ends).
"""


def average_pool(
    t: Tensor,
    kernel_size: tuple[int, ...],
    stride: tuple[int, ...] | None = None,
    padding: tuple[int, ...] | None = None,
    out_pads: tuple[int, ...] | None = None,
    dilation: tuple[int, ...] | None = None,
    in_dilations: tuple[int, ...] | None = None,
    auto_pad: PadType = "not_set",
    ceil_mode: bool = False,
) -> Tensor:
    """ONNX ``AveragePool``: the mean of each window, padding excluded from the divisor.
    {doc}
    Each output is the sum of the window's input elements divided by their number (ONNX
    ``count_include_pad=0``, torch ``count_include_pad=False``).

    Returns:
        The pooled tensor, named ``averagepool_out``.

    Raises:
        ValueError: an unknown ``auto_pad`` or negative paddings.
        PopXLException: argument lengths that do not match the input's spatial axes.
    """
    check_in_graph(context.get_current_graph(), t=t)
    attrs = _pool_attrs(
        "average_pool",
        t,
        kernel_size,
        stride,
        padding,
        out_pads,
        dilation,
        in_dilations,
        auto_pad,
        ceil_mode,
    )
    return record(AVERAGE_POOL, {"t": t}, attrs, ["averagepool_out"])[0]


def max_pool(
    t: Tensor,
    kernel_size: tuple[int, ...],
    stride: tuple[int, ...] | None = None,
    padding: tuple[int, ...] | None = None,
    out_pads: tuple[int, ...] | None = None,
    dilation: tuple[int, ...] | None = None,
    in_dilations: tuple[int, ...] | None = None,
    auto_pad: PadType = "not_set",
    ceil_mode: bool = False,
    storage_order: Literal["row", "column"] = "row",
) -> Tensor:
    """ONNX ``MaxPool``: the largest element of each window (padding never wins).
    {doc}
    ``storage_order`` ("row" or "column") only affects ONNX's indices output, which PopXL
    does not return.

    Returns:
        The pooled tensor, named ``maxpool_out``.

    Raises:
        ValueError: an unknown ``auto_pad`` or ``storage_order``, or negative paddings.
        PopXLException: argument lengths that do not match the input's spatial axes.
    """
    check_in_graph(context.get_current_graph(), t=t)
    attrs = _pool_attrs(
        "max_pool",
        t,
        kernel_size,
        stride,
        padding,
        out_pads,
        dilation,
        in_dilations,
        auto_pad,
        ceil_mode,
    )
    msg = "storage_order {!r} is not valid, must be 'row' or 'column'."
    attrs["storage_order"] = _check_choice(storage_order, ("row", "column"), msg)
    return record(MAX_POOL, {"t": t}, attrs, ["maxpool_out"])[0]


average_pool.__doc__ = (average_pool.__doc__ or "").format(doc=POOL_DOC)
max_pool.__doc__ = (max_pool.__doc__ or "").format(doc=POOL_DOC)
