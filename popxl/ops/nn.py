"""Neural-network ops: matmul, softmax, convolution, pooling, normalisation, resizing.

Convolutions and pools follow ONNX (``NC[D]HW`` layout, paddings listed as all begins then
all ends); their window geometry is resolved from the input shapes by both inference and
lowering, so the recorded attributes are the user's arguments. IPU planning hints
(memory proportions, partials types, dithering) are validated and otherwise ignored.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

import numpy as np

from .. import context, dtypes
from .._op import core_error, define
from ..tensor import Tensor
from ._base import check_in_graph, jax, jnp, lax, normalize_axis, record, same_dtype, spec

# matmul ----------------------------------------------------------------------------------


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if not a or not b:
        raise core_error(f"matmul needs inputs of rank >= 1, got shapes {a} and {b}.")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise core_error(
            f"matmul: the inner dimensions of {a} and {b} differ ({a2[-1]} != {b2[-2]})."
        )
    try:
        import numpy as np  # noqa: PLC0415

        batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError:
        raise core_error(f"matmul: batch dimensions of {a} and {b} do not broadcast.") from None
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _matmul_infer(a: Any, b: Any, *, output_type: dtypes.dtype | None, partials_type: Any) -> list:
    dt = same_dtype("MatMul", a, b)
    return [spec(_matmul_shape(a.shape, b.shape), output_type or dt)]


def _matmul(x: Any, y: Any, *, output_type: Any, partials_type: Any) -> Any:
    accumulate = jnp.float32 if partials_type is dtypes.float32 or partials_type is None else None
    if x.dtype == jnp.float16 and accumulate is not None:
        return jnp.matmul(x, y, preferred_element_type=accumulate).astype(x.dtype)
    return jnp.matmul(x, y)


MATMUL = define("matmul", "MatMul", _matmul_infer, _matmul)


def matmul(
    lhs: Tensor,
    rhs: Tensor,
    available_memory_proportion: float | None = None,
    output_type: dtypes.dtype | None = None,
    partials_type: dtypes.dtype | None = None,
) -> Tensor:
    """Matrix product with NumPy ``matmul`` rules (1-D promotion, batch broadcasting).

    Args:
        lhs, rhs: inputs of the same dtype.
        available_memory_proportion: an IPU tiling hint; no effect here.
        output_type: dtype of the result (default: the inputs' dtype).
        partials_type: accumulation type, ``float32`` (default) or ``float16``.

    Raises:
        ValueError: a ``partials_type`` other than float16/float32.
        PopXLException: mismatched dtypes or inner dimensions.
    """
    if partials_type is not None and partials_type not in (dtypes.float16, dtypes.float32):
        raise ValueError(f"partials_type must be float16 or float32, got {partials_type}.")
    attrs = {"output_type": output_type, "partials_type": partials_type}
    return record(MATMUL, {"lhs": lhs, "rhs": rhs}, attrs, ["matmul_out"])[0]


# softmax ---------------------------------------------------------------------------------


def _axis_infer(t: Any, *, axis: int) -> list:
    return [t]


SOFTMAX = define("softmax", "Softmax", _axis_infer, lambda x, *, axis: jax.nn.softmax(x, axis=axis))
LOG_SOFTMAX = define(
    "log_softmax", "LogSoftmax", _axis_infer, lambda x, *, axis: jax.nn.log_softmax(x, axis=axis)
)


def softmax(t: Tensor, axis: int) -> Tensor:
    """Softmax along ``axis`` (required; negative axes count from the end)."""
    return record(SOFTMAX, {"t": t}, {"axis": normalize_axis(axis, t.rank)}, ["softmax_out"])[0]


def log_softmax(t: Tensor, axis: int) -> Tensor:
    """``log(softmax(t, axis))``, computed stably (an addition to the original op set)."""
    attrs = {"axis": normalize_axis(axis, t.rank)}
    return record(LOG_SOFTMAX, {"t": t}, attrs, ["log_softmax_out"])[0]


# Window geometry (shared by convolutions and pools) --------------------------------------
#
# Per spatial axis a window geometry is ``(low pad, high pad, output size)``. The high pad is
# the exact amount the output size needs: negative when trailing input is never reached,
# larger than requested under ``ceil_mode``.

PadType = Literal["not_set", "same_upper", "same_lower", "valid"]
PAD_TYPES = ("not_set", "same_upper", "same_lower", "valid")
FLOATS = (dtypes.float16, dtypes.float32)

BAD_PAD_TYPE_MSG = "pad type {!r} is not valid, must be not_set, same_upper, same_lower or valid."
BAD_LENGTH_MSG = (
    "{op}: `{what}` needs {n} values for an input of shape {shape} ({k} spatial axes), got "
    "{got}.{hint}"
)
PADS_HINT = " Paddings list all begins then all ends: [x1_begin, x2_begin, ..., x1_end, ...]."
EMPTY_OUTPUT_MSG = (
    "{op}: the window (kernel {kernel}, dilation {dilation}) does not fit the padded input of "
    "spatial shape {spatial}, so the output would be empty. Use a smaller kernel or more padding."
)


def _per_axis(op: str, values: Any, shape: tuple, what: str, fill: int, pairs: bool = False,
              minimum: int = 1) -> tuple[int, ...]:
    """One int per spatial axis of ``shape`` (two for begin/end pads).

    Empty, or all ``fill`` (like the 2-D defaults given for a 1-D or 3-D input), means
    ``fill`` on every axis.
    """
    k = len(shape) - 2
    n = 2 * k if pairs else k
    got = tuple(int(v) for v in values or ())
    if all(v == fill for v in got):
        return (fill,) * n
    if len(got) != n:
        hint = PADS_HINT if pairs else ""
        raise core_error(BAD_LENGTH_MSG.format(op=op, what=what, n=n, shape=shape, k=k,
                                               got=got, hint=hint))
    if any(v < minimum for v in got):
        raise ValueError(f"{op}: every `{what}` value must be >= {minimum}, got {got}.")
    return got


def _check_spatial_rank(op: str, t: Tensor) -> None:
    if t.rank < 3:
        raise core_error(f"{op}: expected an input (N, C, *spatial) of rank >= 3, got shape "
                         f"{t.shape}.")


def _check_choice(value: Any, choices: tuple[str, ...], message: str) -> str:
    if value not in choices:
        raise ValueError(message.format(value))
    return value


def _window(d: int, k: int, s: int, dil: int, lo: int, hi: int, pad_type: str,
            ceil_mode: bool = False) -> tuple[int, int, int]:
    """Geometry of one axis of length ``d`` (ONNX rules; ``same_*``: ``out = ceil(d / s)``)."""
    k_eff = (k - 1) * dil + 1
    if pad_type == "valid":
        lo = hi = 0
    if pad_type in ("same_upper", "same_lower"):
        out = -(-d // s)
        total = max(0, (out - 1) * s + k_eff - d)
        lo = total // 2 if pad_type == "same_upper" else total - total // 2
    else:
        span = d + lo + hi - k_eff
        out = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (out - 1) * s >= d + lo:
            out -= 1  # a last window starting in the end padding is dropped (torch, ONNX)
    return lo, (out - 1) * s + k_eff - d - lo, out


def _nonempty(op: str, windows: list, spatial: tuple, kernel: tuple, dilation: tuple) -> list:
    if any(out < 1 for *_, out in windows):
        raise core_error(EMPTY_OUTPUT_MSG.format(op=op, kernel=tuple(kernel),
                                                 dilation=dilation, spatial=spatial))
    return windows


def _compute_type(x: Any) -> Any:
    """float32 for float16 (and integer) data: statistics and weighted sums keep precision."""
    return jnp.promote_types(x.dtype, jnp.float32)


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


def _conv_windows(x: tuple, w: tuple, stride: tuple, padding: tuple, dilation: tuple,
                  pad_type: str) -> list:
    k = len(x) - 2
    windows = [
        _window(x[2 + i], w[2 + i], stride[i], dilation[i], padding[i], padding[k + i], pad_type)
        for i in range(k)
    ]
    return _nonempty("conv", windows, x[2:], w[2:], dilation)


def _conv_out_channels(op: str, x: tuple, w: tuple, groups: int, transpose: bool) -> int:
    if len(x) < 3 or len(w) != len(x):
        raise core_error(f"{op}: expected an input (N, C, *spatial) of rank >= 3 and a weight "
                         f"of the same rank, got shapes {x} and {w}.")
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
        raise core_error(f"{op}: inputs must be float16 or float32, got {dt.name}. For float8 "
                         "data use the _pow2scaled variant.")
    return dt


def _conv(x: Any, w: Any, strides: tuple, pads: list, dilation: tuple, groups: int,
          lhs_dilation: tuple | None = None) -> Any:
    out = lax.conv_general_dilated(
        x, w, strides, pads, lhs_dilation=lhs_dilation, rhs_dilation=dilation,
        feature_group_count=groups, precision=lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32 if x.dtype == jnp.float16 else None,
    )
    return out.astype(x.dtype)


def _conv_infer(t: Any, w: Any, *scale: Any, stride: tuple, padding: tuple, dilation: tuple,
                groups: int, pad_type: str) -> list:
    dt = _conv_dtype("Conv", t, w, scale)
    m = _conv_out_channels("conv", t.shape, w.shape, groups, transpose=False)
    windows = _conv_windows(t.shape, w.shape, stride, padding, dilation, pad_type)
    return [spec((t.shape[0], m, *(out for *_, out in windows)), dt)]


def _lower_conv(x: Any, w: Any, *, stride: tuple, padding: tuple, dilation: tuple, groups: int,
                pad_type: str) -> Any:
    windows = _conv_windows(x.shape, w.shape, stride, padding, dilation, pad_type)
    return _conv(x, w, stride, [(lo, hi) for lo, hi, _ in windows], dilation, groups)


def _pow2scaled(lower: Any) -> Any:
    """The float8 form of a conv lowering: exact float32 compute, times 2**log2_scale, float16."""

    def lower_pow2scaled(x: Any, w: Any, log2_scale: Any, **attrs: Any) -> Any:
        out = lower(x.astype(jnp.float32), w.astype(jnp.float32), **attrs)
        return jnp.ldexp(out, log2_scale.astype(jnp.int32)).astype(jnp.float16)

    return lower_pow2scaled


CONV = define("conv", "Conv", _conv_infer, _lower_conv)
CONV_POW2SCALED = define(
    "conv_pow2scaled", "Conv", _conv_infer, _pow2scaled(_lower_conv), grad="none"
)


def _conv_attrs(op: str, t: Tensor, stride: Any, padding: Any, dilation: Any, groups: Any,
                pad_type: Any) -> dict:
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
    from .float8 import FLOAT8, _check_log2_scale  # noqa: PLC0415 (float8 imports this module)

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


def _transpose_windows(x: tuple, w: tuple, *, stride: tuple, padding: tuple, dilation: tuple,
                       pad_type: str, output_padding: tuple, output_shape: tuple) -> list:
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
    c, m_per_group, *kernel = w.shape
    # A transposed conv is a conv of the stride-dilated input with the spatially flipped
    # kernel, its in/out channel axes swapped within each group.
    w = w.reshape(groups, c // groups, m_per_group, *kernel).swapaxes(1, 2)
    w = w.reshape(groups * m_per_group, c // groups, *kernel)
    w = jnp.flip(w, tuple(range(2, w.ndim)))
    pads = [
        ((k - 1) * d - lo, (k - 1) * d - hi + extra)
        for k, d, (lo, hi, _), extra in zip(kernel, attrs["dilation"], windows,
                                            attrs["output_padding"])
    ]
    n = len(kernel)
    return _conv(x, w, (1,) * n, pads, attrs["dilation"], groups, lhs_dilation=attrs["stride"])


CONV_TRANSPOSE = define(
    "conv_transpose", "ConvTranspose", _conv_transpose_infer, _lower_conv_transpose
)
CONV_TRANSPOSE_POW2SCALED = define(
    "conv_transpose_pow2scaled", "ConvTranspose", _conv_transpose_infer,
    _pow2scaled(_lower_conv_transpose), grad="none",
)


def _conv_transpose_attrs(op: str, t: Tensor, weight: Tensor, output_padding: Any,
                          output_shape: Any, *conv_args: Any) -> dict:
    attrs = _conv_attrs(op, t, *conv_args)
    attrs["output_padding"] = _per_axis(op, output_padding, t.shape, "output_padding", 0,
                                        minimum=0)
    shape = tuple(int(v) for v in output_shape or ())
    if len(shape) == t.rank:
        expected = (t.shape[0], weight.shape[1] * attrs["groups"])
        if weight.rank > 1 and shape[:2] != expected:
            raise ValueError(f"{op}: output_shape {shape} does not start with (N, M) = "
                             f"{expected}; pass the spatial sizes only.")
        shape = shape[2:]
    if shape and len(shape) != t.rank - 2:
        raise ValueError(f"{op}: output_shape needs one size per spatial axis of the input "
                         f"{t.shape} (or the full output shape), got {tuple(output_shape)}.")
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
    attrs = _conv_transpose_attrs("conv_transpose", t, weight, output_padding, output_shape,
                                  stride, padding, dilation, groups, pad_type)
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
    attrs = _conv_transpose_attrs(op, t, weight, output_padding, output_shape,
                                  stride, padding, dilation, groups, pad_type)
    inputs = {"t": t, "weight": weight, "log2_scale": log2_scale}
    return record(CONV_TRANSPOSE_POW2SCALED, inputs, attrs, ["convtranspose_out"])[0]


# Pooling ---------------------------------------------------------------------------------


def _pool_windows(op: str, x: tuple, *, kernel_size: tuple, stride: tuple, padding: tuple,
                  dilation: tuple, in_dilations: tuple, auto_pad: str, ceil_mode: bool,
                  **_: Any) -> list:
    k = len(x) - 2
    windows = [
        _window((x[2 + i] - 1) * in_dilations[i] + 1, kernel_size[i], stride[i], dilation[i],
                padding[i], padding[k + i], auto_pad, ceil_mode)
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


def _pool(x: Any, fill: Any, reducer: Any, attrs: dict) -> Any:
    """Reduce every window of ``x``; padding and input-dilation holes hold ``fill``."""
    windows = _pool_windows("pool", x.shape, **attrs)
    fill = np.asarray(fill, x.dtype)  # concrete, so JAX picks the differentiable sum/max forms
    interior = [(lo, hi, d - 1) for (lo, hi, _), d in zip(windows, attrs["in_dilations"])]
    padded = lax.pad(x, fill, [(0, 0, 0)] * 2 + interior)
    kernel, stride, dilation = attrs["kernel_size"], attrs["stride"], attrs["dilation"]
    if reducer is lax.max and any(d > 1 for d in dilation):
        # JAX has no max-pool gradient with window dilation: take the max over kernel taps.
        out_sp = [out for *_, out in windows]
        taps = [
            padded[(..., *(slice(j * d, j * d + (o - 1) * s + 1, s)
                           for j, d, o, s in zip(tap, dilation, out_sp, stride)))]
            for tap in np.ndindex(*kernel)
        ]
        out = functools.reduce(jnp.maximum, taps)
    else:
        ones = (1, 1)
        out = lax.reduce_window(padded, fill, reducer, ones + kernel, ones + stride, "VALID",
                                window_dilation=ones + dilation)
    k, pads = x.ndim - 2, attrs["out_pads"]
    out_config = [(0, 0, 0)] * 2 + [(pads[i], pads[k + i], 0) for i in range(k)]
    return lax.pad(out, jnp.zeros((), x.dtype), out_config)


def _lower_average_pool(x: Any, **attrs: Any) -> Any:
    f = _compute_type(x)
    sums = _pool(x.astype(f), 0, lax.add, attrs)
    counts = _pool(jnp.ones(x.shape, f), 0, lax.add, attrs)
    return (sums / jnp.maximum(counts, 1)).astype(x.dtype)


def _lower_max_pool(x: Any, storage_order: str, **attrs: Any) -> Any:
    lowest = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    return _pool(x, lowest, lax.max, attrs)


AVERAGE_POOL = define("average_pool", "AveragePool", _pool_infer("average_pool"),
                      _lower_average_pool)
MAX_POOL = define("max_pool", "MaxPool", _pool_infer("max_pool"), _lower_max_pool)


def _pool_attrs(op: str, t: Tensor, kernel_size: Any, stride: Any, padding: Any,
                out_pads: Any, dilation: Any, in_dilations: Any, auto_pad: Any,
                ceil_mode: Any) -> dict:
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
    attrs = _pool_attrs("average_pool", t, kernel_size, stride, padding, out_pads, dilation,
                        in_dilations, auto_pad, ceil_mode)
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
    attrs = _pool_attrs("max_pool", t, kernel_size, stride, padding, out_pads, dilation,
                        in_dilations, auto_pad, ceil_mode)
    msg = "storage_order {!r} is not valid, must be 'row' or 'column'."
    attrs["storage_order"] = _check_choice(storage_order, ("row", "column"), msg)
    return record(MAX_POOL, {"t": t}, attrs, ["maxpool_out"])[0]


average_pool.__doc__ = (average_pool.__doc__ or "").format(doc=POOL_DOC)
max_pool.__doc__ = (max_pool.__doc__ or "").format(doc=POOL_DOC)


# Normalisation ---------------------------------------------------------------------------


def _channel_params_dtype(op: str, t: Any, *params: Any) -> dtypes.dtype:
    if len(t.shape) < 2:
        raise core_error(f"{op}: expected an input (N, C, ...) of rank >= 2, got shape {t.shape}.")
    for p in params:
        if p.shape != (t.shape[1],):
            raise core_error(f"{op}: per-channel parameters must have shape ({t.shape[1]},) "
                             f"for an input of shape {t.shape}, got {p.shape}.")
    dt = same_dtype(op, t, *params)
    if dt not in FLOATS:
        raise core_error(f"{op}: inputs must be float16 or float32, got {dt.name}.")
    return dt


def _per_channel(p: Any, x: Any) -> Any:
    return p.astype(_compute_type(x)).reshape((1, -1) + (1,) * (x.ndim - 2))


def _batch_norm_infer(t: Any, *params: Any, epsilon: float, momentum: float) -> list:
    return [spec(t.shape, _channel_params_dtype("BatchNormalization", t, *params))]


def _lower_batch_norm(x: Any, scale: Any, bias: Any, mean: Any, var: Any, *, epsilon: float,
                      momentum: float) -> Any:
    centred = x.astype(_compute_type(x)) - _per_channel(mean, x)
    y = centred * lax.rsqrt(_per_channel(var, x) + epsilon)
    return (y * _per_channel(scale, x) + _per_channel(bias, x)).astype(x.dtype)


BATCH_NORM = define("batch_norm_inference", "BatchNormalization", _batch_norm_infer,
                    _lower_batch_norm)


def batch_norm_inference(
    t: Tensor,
    scale: Tensor,
    bias: Tensor,
    mean: Tensor,
    var: Tensor,
    epsilon: float = 1e-05,
    momentum: float = 0.9,
) -> Tensor:
    """Inference batch normalisation: ``(t - mean) / sqrt(var + epsilon) * scale + bias``.

    ``t`` is ``(N, C, ...)``; the other inputs are ``(C,)`` and apply along axis 1. All share
    one dtype; float16 data is normalised in float32. ``momentum`` only matters when training
    statistics, so it has no effect here. Every input is differentiable.

    Returns:
        The normalised tensor, named ``batch_norm_out``.

    Raises:
        PopXLException: parameters not of shape ``(C,)`` or mismatched dtypes.
    """
    inputs = {"t": t, "scale": scale, "bias": bias, "mean": mean, "var": var}
    attrs = {"epsilon": float(epsilon), "momentum": float(momentum)}
    return record(BATCH_NORM, inputs, attrs, ["batch_norm_out"])[0]


def _group_norm_infer(t: Any, weight: Any, bias: Any, *, num_groups: int, eps: float) -> list:
    dt = _channel_params_dtype("GroupNormalization", t, weight, bias)
    if t.shape[1] % num_groups:
        raise core_error(f"group_norm: the {t.shape[1]} channels of the input {t.shape} do not "
                         f"split into num_groups={num_groups} equal groups.")
    stats = spec((t.shape[0] * num_groups,), dt)
    return [spec(t.shape, dt), stats, stats]


def _lower_group_norm(x: Any, weight: Any, bias: Any, *, num_groups: int, eps: float) -> Any:
    groups = x.astype(_compute_type(x)).reshape(x.shape[0], num_groups, -1)
    mean = groups.mean(axis=-1, keepdims=True)
    inv_std = lax.rsqrt(jnp.square(groups - mean).mean(axis=-1, keepdims=True) + eps)
    y = ((groups - mean) * inv_std).reshape(x.shape)
    y = y * _per_channel(weight, x) + _per_channel(bias, x)
    return y.astype(x.dtype), mean.reshape(-1).astype(x.dtype), inv_std.reshape(-1).astype(x.dtype)


GROUP_NORM = define("group_norm", "GroupNormalization", _group_norm_infer, _lower_group_norm)


def group_norm(t: Tensor, weight: Tensor, bias: Tensor, num_groups: int,
               eps: float = 1e-05) -> Tensor:
    """Group normalisation of an ``(N, C, ...)`` input with per-channel ``weight``/``bias``.

    The channels split into ``num_groups`` consecutive groups; each (sample, group) is
    normalised over its channels and all remaining axes with the biased variance:
    ``(t - mean) / sqrt(var + eps) * weight + bias``. ``weight`` and ``bias`` are ``(C,)``
    of ``t``'s dtype. The op also records the statistics ``group_norm_mean`` and
    ``group_norm_inv_std_dev`` (shape ``(N * num_groups,)``) as the original does, but only
    the normalised tensor is returned.

    Returns:
        The normalised tensor, named ``group_norm_out``.

    Raises:
        ValueError: ``num_groups`` < 1.
        PopXLException: ``C`` not divisible by ``num_groups``, parameters not ``(C,)`` or
            mismatched dtypes.

    See also ``torch.nn.functional.group_norm``.
    """
    if int(num_groups) < 1:
        raise ValueError(f"group_norm: num_groups must be >= 1, got {num_groups}.")
    inputs = {"t": t, "weight": weight, "bias": bias}
    attrs = {"num_groups": int(num_groups), "eps": float(eps)}
    names = ["group_norm_out", "group_norm_mean", "group_norm_inv_std_dev"]
    return record(GROUP_NORM, inputs, attrs, names)[0]


def layer_norm(t: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-05) -> Tensor:
    """``group_norm(t, weight, bias, num_groups=1, eps)``, as in the original.

    Each sample is normalised over all axes but the first, while ``weight`` and ``bias``
    are per channel (axis 1, shape ``(C,)``): this equals ``torch.nn.LayerNorm`` only for
    2-D inputs.

    Returns:
        The normalised tensor, named ``group_norm_out``.
    """
    return group_norm(t, weight, bias, num_groups=1, eps=eps)


# Resize ----------------------------------------------------------------------------------

INTERPOLATE_MODES = ("nearest", "linear", "cubic")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
COORDINATE_MODES = (
    "half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"
)
NEAREST_ROUNDING = {
    "round_prefer_floor": lambda c: np.ceil(c - 0.5),
    "round_prefer_ceil": lambda c: np.floor(c + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}
CUBIC_A = -0.75  # ONNX's default cubic_coeff_a


def _resized_shape(shape: tuple, scale_factor: tuple) -> tuple[int, ...]:
    if len(scale_factor) != len(shape):
        raise core_error(f"interpolate: scale_factor needs one value per axis of the input "
                         f"{shape}, got {scale_factor}.")
    # float32 arithmetic, as the original's (its scales are float32)
    out = tuple(math.floor(np.float32(d) * np.float32(s)) for d, s in zip(shape, scale_factor))
    if any(o < 1 for o in out):
        raise core_error(f"interpolate: scale_factor {scale_factor} shrinks the input {shape} "
                         f"to the empty shape {out}.")
    return out


def _source_coords(out_len: int, in_len: int, scale: float, mode: str) -> np.ndarray:
    """Input coordinate of each output position along one axis (ONNX Resize, in float32).

    ``size``, the unrounded output length ``in_len * scale``, is what ``align_corners``
    and ``tf_crop_and_resize`` stretch over (as the ONNX reference and the original do).
    """
    f = np.float32
    x, scale = np.arange(out_len, dtype=f), f(scale)
    size = f(in_len) * scale
    if mode == "asymmetric":
        return x / scale
    if mode in ("align_corners", "tf_crop_and_resize"):  # the latter with the whole-input roi
        if size == 1:
            return np.full(out_len, 0.0 if mode == "align_corners" else (in_len - 1) / 2, f)
        return x * f(in_len - 1) / (size - 1)
    if mode == "pytorch_half_pixel" and size <= 1:
        return np.zeros(out_len, f)
    return (x + f(0.5)) / scale - f(0.5)


def _cubic_weights(r: np.ndarray) -> np.ndarray:
    """Keys cubic weights of the taps at offsets -1, 0, 1, 2 from ``floor(coordinate)``."""
    a = CUBIC_A

    def near(d: np.ndarray) -> np.ndarray:  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: np.ndarray) -> np.ndarray:  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return np.stack([far(r + 1), near(r), near(1 - r), far(2 - r)])


def _resize_taps(out_len: int, in_len: int, scale: float, mode: str, nearest_mode: str,
                 coordinate_mode: str) -> tuple[np.ndarray, np.ndarray]:
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
        weights = np.stack([1 - frac, frac]) if mode == "linear" else _cubic_weights(frac)
    return np.clip(index, 0, in_len - 1).astype(np.int32), weights


def _interpolate_infer(t: Any, *, scale_factor: tuple, **_: Any) -> list:
    return [spec(_resized_shape(t.shape, scale_factor), t.dtype)]


def _lower_interpolate(x: Any, *, scale_factor: tuple, mode: str, nearest_mode: str,
                       coordinate_transformation_mode: str) -> Any:
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
        taps = [jnp.take(y, i, axis=axis) * jnp.asarray(w, y.dtype).reshape(shape)
                for i, w in zip(index, weights)]
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
    mode = _check_choice(mode or "nearest", INTERPOLATE_MODES,
                         "interpolate type {!r} is not valid, must be nearest, linear or cubic.")
    nearest_mode = _check_choice(
        nearest_mode or "round_prefer_floor", NEAREST_MODES,
        "nearest mode {!r} is not valid, must be round_prefer_floor, round_prefer_ceil, "
        "floor or ceil.",
    )
    coordinate_mode = _check_choice(
        coordinate_transformation_mode or "half_pixel", COORDINATE_MODES,
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


def _roi_align_infer(t: Any, rois: Any, batch_index: Any, *, output_size: tuple,
                     spatial_scale: float, sampling_ratio: int) -> list:
    if len(t.shape) != 4:
        raise core_error(f"roi_align: the input must be (N, C, H, W), got shape {t.shape}.")
    if len(rois.shape) != 2 or rois.shape[1] != 4:
        raise core_error(f"roi_align: rois must be (num_rois, 4) boxes [x1, y1, x2, y2], got "
                         f"shape {rois.shape}.")
    if batch_index.shape != rois.shape[:1]:
        raise core_error(f"roi_align: batch_index must be ({rois.shape[0]},), one image index "
                         f"per roi, got shape {batch_index.shape}.")
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

    total = lax.fori_loop(0, count, add_sample, jnp.zeros((*start.shape, bins, length),
                                                          start.dtype))
    return total / grid[:, None, None]


def _lower_roi_align(x: Any, rois: Any, batch_index: Any, *, output_size: tuple,
                     spatial_scale: float, sampling_ratio: int) -> Any:
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


ROI_ALIGN = define("roi_align", "RoiAlign", _roi_align_infer, _lower_roi_align,
                   nondiff_inputs=(1, 2))


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
        raise ValueError(f"roi_align: output_size must be two positive ints (out_h, out_w), "
                         f"got {tuple(output_size)}.")
    attrs = {"output_size": size, "spatial_scale": float(spatial_scale),
             "sampling_ratio": int(sampling_ratio)}
    inputs = {"t": t, "rois": rois, "batch_index": batch_index}
    return record(ROI_ALIGN, inputs, attrs, ["roi_align_out"])[0]
