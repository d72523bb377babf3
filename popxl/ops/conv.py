"""Convolution ops: ``conv``, ``conv_transpose`` and their float8 ``_pow2scaled`` forms.

They follow ONNX (``NC[D]HW`` layout, paddings listed as all begins then all ends); the
window geometry is resolved from the input shapes by both inference and lowering, so the
recorded attributes are the user's arguments. IPU planning hints (memory proportions,
partials types, dithering) are validated and otherwise ignored.
"""

from __future__ import annotations

from typing import Any

from .. import context, dtypes
from .._op import core_error, define
from ..tensor import Tensor
from ._base import _LazyModule, check_in_graph, jnp, lax, record, same_dtype, spec
from ._spatial import (
    BAD_PAD_TYPE_MSG,
    PAD_TYPES,
    PadType,
    _check_spatial_rank,
    _nonempty,
    _per_axis,
    _window,
)
from .float8 import FLOAT8, _check_log2_scale
from .nn import FLOATS, _check_choice

# The lowering's forms (matmul, per-tap and XLA convolutions): imported on first lowering.
_forms: Any = _LazyModule("runtime.backend.conv_forms")

# Convolution -----------------------------------------------------------------------------

GROUPS_MSG = (
    "{op}: input of shape {x} and weight of shape {w} do not match with groups={groups}: "
    "expected a weight {expected}."
)


def _check_conv_options(available_memory_proportions: Any, partials_types: Any = None) -> None:
    for p in available_memory_proportions or ():
        if not 0.0 < float(p) <= 1.0:
            raise ValueError(f"available_memory_proportions must be in (0, 1], got {p}.")
    for p in partials_types or ():
        if str(p).lower() not in ("float", "half"):
            raise ValueError(f"Bad partials type {p!r}: choose 'float' or 'half'.")


def _conv_windows(
    x: tuple, w: tuple, stride: tuple, padding: tuple, dilation: tuple, pad_type: str
) -> list:
    k = len(x) - 2
    windows = [
        _window(x[2 + i], w[2 + i], stride[i], dilation[i], padding[i], padding[k + i], pad_type)
        for i in range(k)
    ]
    return _nonempty("conv", windows, x[2:], w[2:], dilation)


def _conv_out_channels(op: str, x: tuple, w: tuple, groups: int, transpose: bool) -> int:
    if len(x) < 3 or len(w) != len(x):
        raise core_error(
            f"{op}: expected an input (N, C, *spatial) of rank >= 3 and a weight "
            f"of the same rank, got shapes {x} and {w}."
        )
    c = x[1]
    if transpose:
        ok, expected, out = w[0] == c and c % groups == 0, f"(C={c}, M/groups, *kernel)", w[1]
        out *= groups
    else:
        ok, out = w[1] * groups == c and w[0] % groups == 0, w[0]
        expected = f"(M, C/groups={c / groups:g}, *kernel) with M divisible by groups"
    if not ok:
        raise core_error(GROUPS_MSG.format(op=op, x=x, w=w, groups=groups, expected=expected))
    return out


def _conv_dtype(op: str, t: Any, w: Any, scale: tuple) -> dtypes.dtype:
    if scale:  # the float8 variants: checked by the public function, result float16
        return dtypes.float16
    dt = same_dtype(op, t, w)
    if dt not in FLOATS:
        raise core_error(
            f"{op}: inputs must be float16 or float32, got {dt.name}. For float8 "
            "data use the _pow2scaled variant."
        )
    return dt


def _conv_infer(
    t: Any,
    w: Any,
    *scale: Any,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    groups: int,
    pad_type: str,
) -> list:
    dt = _conv_dtype("Conv", t, w, scale)
    m = _conv_out_channels("conv", t.shape, w.shape, groups, transpose=False)
    windows = _conv_windows(t.shape, w.shape, stride, padding, dilation, pad_type)
    return [spec((t.shape[0], m, *(out for *_, out in windows)), dt)]


def _lower_conv(
    x: Any, w: Any, *, stride: tuple, padding: tuple, dilation: tuple, groups: int, pad_type: str
) -> Any:
    windows = _conv_windows(x.shape, w.shape, stride, padding, dilation, pad_type)
    pads = tuple((lo, hi) for lo, hi, _ in windows)
    return _forms.conv(x, w, _forms.Geometry(stride, pads, dilation, groups))


def _pow2scaled(lower: Any) -> Any:
    """The float8 form of a conv lowering: exact float32 compute, times 2**log2_scale, float16."""

    def lower_pow2scaled(x: Any, w: Any, log2_scale: Any, **attrs: Any) -> Any:
        # The barrier keeps XLA's GPU compiler from rewriting the widened float8 operands
        # into a float8 cuDNN convolution, which it then fails to configure.
        x, w = lax.optimization_barrier((x.astype(jnp.float32), w.astype(jnp.float32)))
        out = lower(x, w, **attrs)
        return jnp.ldexp(out, log2_scale.astype(jnp.int32)).astype(jnp.float16)

    return lower_pow2scaled


CONV = define("conv", "Conv", _conv_infer, _lower_conv, grad_needs="others")
CONV_POW2SCALED = define(
    "conv_pow2scaled",
    "Conv",
    _conv_infer,
    _pow2scaled(_lower_conv),
    grad="none",
    special="log2_scale_checked",  # runtime/lowering/checks.py: log2_scale (last input) in [-32, 32)
)


def _conv_attrs(
    op: str, t: Tensor, stride: Any, padding: Any, dilation: Any, groups: Any, pad_type: Any
) -> dict:
    _check_spatial_rank(op, t)
    pad_type = _check_choice(pad_type or "not_set", PAD_TYPES, BAD_PAD_TYPE_MSG)
    groups = 1 if groups is None else int(groups)
    if groups < 1:
        raise ValueError(f"{op}: groups must be >= 1, got {groups}.")
    return {
        "stride": _per_axis(op, stride, t.shape, "stride", 1),
        "padding": _per_axis(op, padding, t.shape, "padding", 0, pairs=True, minimum=0),
        "dilation": _per_axis(op, dilation, t.shape, "dilation", 1),
        "groups": groups,
        "pad_type": pad_type,
    }


def _check_pow2scaled(op: str, t: Tensor, weight: Tensor, log2_scale: Tensor) -> None:
    for what, x in (("t", t), ("weight", weight)):
        if x.dtype not in FLOAT8:
            raise TypeError(
                f"{op}: scaled conv operands must be of dtype popxl.float8_143 or "
                f"popxl.float8_152, but `{what}` is {x.dtype.name}. Convert it with "
                "ops.pow2scale_cast_to_fp8 first."
            )
    _check_log2_scale(op, log2_scale)


def conv(
    t: Tensor,
    weight: Tensor,
    stride: tuple[int, ...] | None = (1, 1),
    padding: tuple[int, ...] | None = (0, 0, 0, 0),
    dilation: tuple[int, ...] | None = (1, 1),
    groups: int | None = 1,
    pad_type: PadType | None = "not_set",
    available_memory_proportions: list[float] | None = None,
    partials_types: list[str] | None = None,
    enable_conv_dithering: list[int] | None = None,
) -> Tensor:
    """ONNX ``Conv`` (no bias) of an ``(N, C, *spatial)`` input with 1, 2 or 3 spatial axes.

    ``weight`` is ``(M, C/groups, *kernel)`` and the output ``(N, M, *out)`` with
    ``out = floor((in + pad_begin + pad_end - ((k - 1) * dilation + 1)) / stride) + 1``.
    ``stride`` and ``dilation`` take one value per spatial axis, ``padding`` two
    (``[x1_begin, x2_begin, ..., x1_end, x2_end, ...]``); empty tuples, and the defaults,
    mean "default on every axis" whatever the rank. ``pad_type`` ``"same_upper"`` and
    ``"same_lower"`` ignore ``padding`` and pad so that ``out = ceil(in / stride)``, an odd
    total putting the extra pixel at the end/beginning; ``"valid"`` means no padding.
    Both inputs are float16 (accumulated in float32) or float32.

    Args:
        t: input ``(N, C, *spatial)``.
        weight: filters ``(M, C/groups, *kernel)`` of ``t``'s dtype.
        stride, padding, dilation, groups, pad_type: as in ONNX ``Conv``.
        available_memory_proportions: IPU planning hint, each in (0, 1]; no effect here.
        partials_types: IPU accumulator types, each "float" or "half"; no effect here.
        enable_conv_dithering: IPU tile-layout hint; no effect here.

    Returns:
        The convolution, named ``conv_out``.

    Raises:
        ValueError: an unknown ``pad_type``, negative paddings or bad option values.
        PopXLException: mismatched dtypes, channel/group counts or argument lengths.

    See also ``torch.nn.functional.conv2d``.
    """
    check_in_graph(context.get_current_graph(), t=t, weight=weight)
    _check_conv_options(available_memory_proportions, partials_types)
    attrs = _conv_attrs("conv", t, stride, padding, dilation, groups, pad_type)
    return record(CONV, {"t": t, "weight": weight}, attrs, ["conv_out"])[0]


def conv_pow2scaled(
    t: Tensor,
    weight: Tensor,
    log2_scale: Tensor,
    stride: tuple[int, ...] | None = (1, 1),
    padding: tuple[int, ...] | None = (0, 0, 0, 0),
    dilation: tuple[int, ...] | None = (1, 1),
    groups: int | None = 1,
    pad_type: PadType | None = "not_set",
    available_memory_proportions: list[float] | None = None,
    enable_conv_dithering: list[int] | None = None,
) -> Tensor:
    """Float8 ``conv`` whose result is multiplied by ``2**log2_scale`` and returned as float16.

    Geometry as in ``conv``. The operands (either float8 format, possibly different) are
    convolved exactly in float32, scaled, then rounded to float16 once. No gradient.

    Args:
        t, weight: float8 input and filters, shaped as for ``conv``.
        log2_scale: int32 scalar tensor.

    Returns:
        The float16 result, named ``conv_out``.

    Raises:
        TypeError: ``t`` or ``weight`` not float8, or ``log2_scale`` not int32.
        ValueError: ``log2_scale`` not a scalar, or bad arguments as for ``conv``.
    """
    check_in_graph(context.get_current_graph(), t=t, weight=weight, log2_scale=log2_scale)
    _check_pow2scaled("conv_pow2scaled", t, weight, log2_scale)
    _check_conv_options(available_memory_proportions)
    attrs = _conv_attrs("conv_pow2scaled", t, stride, padding, dilation, groups, pad_type)
    inputs = {"t": t, "weight": weight, "log2_scale": log2_scale}
    return record(CONV_POW2SCALED, inputs, attrs, ["conv_out"])[0]


# Transposed convolution ------------------------------------------------------------------


def _transpose_windows(
    x: tuple,
    w: tuple,
    *,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    pad_type: str,
    output_padding: tuple,
    output_shape: tuple,
) -> list:
    """(pad_begin, pad_end, out) per axis by the ONNX ``ConvTranspose`` rules."""
    k = len(x) - 2
    windows = []
    for i in range(k):
        full = stride[i] * (x[2 + i] - 1) + output_padding[i] + (w[2 + i] - 1) * dilation[i] + 1
        if output_shape or pad_type in ("same_upper", "same_lower"):
            total = full - (output_shape[i] if output_shape else x[2 + i] * stride[i])
            lo = total // 2 if pad_type == "same_upper" else total - total // 2
            hi = total - lo
        elif pad_type == "valid":
            lo = hi = 0
        else:
            lo, hi = padding[i], padding[k + i]
        windows.append((lo, hi, full - lo - hi))
    return _nonempty("conv_transpose", windows, x[2:], w[2:], dilation)


def _conv_transpose_infer(t: Any, w: Any, *scale: Any, groups: int, **attrs: Any) -> list:
    dt = _conv_dtype("ConvTranspose", t, w, scale)
    m = _conv_out_channels("conv_transpose", t.shape, w.shape, groups, transpose=True)
    windows = _transpose_windows(t.shape, w.shape, **attrs)
    return [spec((t.shape[0], m, *(out for *_, out in windows)), dt)]


def _lower_conv_transpose(x: Any, w: Any, *, groups: int, **attrs: Any) -> Any:
    windows = _transpose_windows(x.shape, w.shape, **attrs)
    # A transposed conv is the input gradient of the conv that maps its output back onto
    # its input: the same stride, dilation and groups, the output padding taken off the end.
    pads = tuple((lo, hi - extra) for (lo, hi, _), extra in zip(windows, attrs["output_padding"]))
    geo = _forms.Geometry(attrs["stride"], pads, attrs["dilation"], groups)
    return _forms.conv_transpose(x, w, geo, tuple(out for *_, out in windows))


CONV_TRANSPOSE = define(
    "conv_transpose", "ConvTranspose", _conv_transpose_infer, _lower_conv_transpose
)
CONV_TRANSPOSE_POW2SCALED = define(
    "conv_transpose_pow2scaled",
    "ConvTranspose",
    _conv_transpose_infer,
    _pow2scaled(_lower_conv_transpose),
    grad="none",
    special="log2_scale_checked",
)


def _conv_transpose_attrs(
    op: str, t: Tensor, weight: Tensor, output_padding: Any, output_shape: Any, *conv_args: Any
) -> dict:
    attrs = _conv_attrs(op, t, *conv_args)
    attrs["output_padding"] = _per_axis(op, output_padding, t.shape, "output_padding", 0, minimum=0)
    shape = tuple(int(v) for v in output_shape or ())
    if len(shape) == t.rank:
        expected = (t.shape[0], weight.shape[1] * attrs["groups"])
        if weight.rank > 1 and shape[:2] != expected:
            raise ValueError(
                f"{op}: output_shape {shape} does not start with (N, M) = "
                f"{expected}; pass the spatial sizes only."
            )
        shape = shape[2:]
    if shape and len(shape) != t.rank - 2:
        raise ValueError(
            f"{op}: output_shape needs one size per spatial axis of the input "
            f"{t.shape} (or the full output shape), got {tuple(output_shape)}."
        )
    if shape and attrs["pad_type"] == "valid":
        raise ValueError(f"{op}: pad_type 'valid' cannot be used if output_shape is also set.")
    attrs["output_shape"] = shape
    return attrs


def conv_transpose(
    t: Tensor,
    weight: Tensor,
    stride: tuple[int, ...] | None = (1, 1),
    padding: tuple[int, ...] | None = (0, 0, 0, 0),
    dilation: tuple[int, ...] | None = (1, 1),
    groups: int | None = 1,
    pad_type: PadType | None = "not_set",
    output_padding: tuple[int, ...] | None = (),
    output_shape: tuple[int, ...] | None = (),
    available_memory_proportions: list[float] | None = None,
    partials_types: list[str] | None = None,
    enable_conv_dithering: list[int] | None = None,
) -> Tensor:
    """ONNX ``ConvTranspose`` (no bias): the gradient of ``conv`` with respect to its input.

    ``t`` is ``(N, C, *spatial)``, ``weight`` ``(C, M/groups, *kernel)`` and the output
    ``(N, M, *out)`` with ``out = stride * (in - 1) + output_padding + (k - 1) * dilation + 1
    - pad_begin - pad_end``. ``output_padding`` adds elements at the end of each axis.
    If ``output_shape`` (spatial sizes, or the full output shape) is given, ``padding`` is
    ignored and the total padding ``total`` is derived from it; ``same_upper`` puts
    ``total // 2`` at the beginning, ``not_set``/``same_lower`` put ``total - total // 2``
    there (the ONNX rule). ``same_*`` without ``output_shape`` target ``out = in * stride``;
    ``valid`` means no padding.

    Args:
        t: input ``(N, C, *spatial)``, float16 or float32.
        weight: filters ``(C, M/groups, *kernel)`` of ``t``'s dtype.
        stride, padding, dilation, groups, pad_type, output_padding, output_shape: as in
            ONNX ``ConvTranspose``.
        available_memory_proportions, partials_types, enable_conv_dithering: as for ``conv``
            (validated, no effect).

    Returns:
        The transposed convolution, named ``convtranspose_out``.

    Raises:
        ValueError: bad ``pad_type``/option values, an ``output_shape`` of the wrong length
            or combined with ``pad_type='valid'``.
        PopXLException: mismatched dtypes, channel/group counts or argument lengths.

    See also ``torch.nn.functional.conv_transpose2d``.
    """
    check_in_graph(context.get_current_graph(), t=t, weight=weight)
    _check_conv_options(available_memory_proportions, partials_types)
    attrs = _conv_transpose_attrs(
        "conv_transpose",
        t,
        weight,
        output_padding,
        output_shape,
        stride,
        padding,
        dilation,
        groups,
        pad_type,
    )
    return record(CONV_TRANSPOSE, {"t": t, "weight": weight}, attrs, ["convtranspose_out"])[0]


def conv_transpose_pow2scaled(
    t: Tensor,
    weight: Tensor,
    log2_scale: Tensor,
    stride: tuple[int, ...] | None = (1, 1),
    padding: tuple[int, ...] | None = (0, 0, 0, 0),
    dilation: tuple[int, ...] | None = (1, 1),
    groups: int | None = 1,
    pad_type: PadType | None = "not_set",
    output_padding: tuple[int, ...] | None = (),
    output_shape: tuple[int, ...] | None = (),
    available_memory_proportions: list[float] | None = None,
    enable_conv_dithering: list[int] | None = None,
) -> Tensor:
    """Float8 ``conv_transpose`` scaled by ``2**log2_scale``, returned as float16.

    Geometry as in ``conv_transpose``; arithmetic as in ``conv_pow2scaled``. No gradient.

    Raises:
        TypeError: ``t`` or ``weight`` not float8, or ``log2_scale`` not int32.
        ValueError: ``log2_scale`` not a scalar, or bad arguments as for ``conv_transpose``.
    """
    op = "conv_transpose_pow2scaled"
    check_in_graph(context.get_current_graph(), t=t, weight=weight, log2_scale=log2_scale)
    _check_pow2scaled(op, t, weight, log2_scale)
    _check_conv_options(available_memory_proportions)
    attrs = _conv_transpose_attrs(
        op, t, weight, output_padding, output_shape, stride, padding, dilation, groups, pad_type
    )
    inputs = {"t": t, "weight": weight, "log2_scale": log2_scale}
    return record(CONV_TRANSPOSE_POW2SCALED, inputs, attrs, ["convtranspose_out"])[0]
