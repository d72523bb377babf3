"""Window geometry shared by convolutions and pools.

Convolutions and pools follow ONNX (``NC[D]HW`` layout, paddings listed as all begins then
all ends); their window geometry is resolved from the input shapes by both inference and
lowering, so the recorded attributes are the user's arguments.
"""

from __future__ import annotations

from typing import Any, Literal

from .._op import core_error
from ..tensor import Tensor

# Window geometry (shared by convolutions and pools) --------------------------------------
#
# Per spatial axis a window geometry is ``(low pad, high pad, output size)``. The high pad is
# the exact amount the output size needs: negative when trailing input is never reached,
# larger than requested under ``ceil_mode``.

PadType = Literal["not_set", "same_upper", "same_lower", "valid"]
PAD_TYPES = ("not_set", "same_upper", "same_lower", "valid")

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


def _per_axis(
    op: str, values: Any, shape: tuple, what: str, fill: int, pairs: bool = False, minimum: int = 1
) -> tuple[int, ...]:
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
        raise core_error(
            BAD_LENGTH_MSG.format(op=op, what=what, n=n, shape=shape, k=k, got=got, hint=hint)
        )
    if any(v < minimum for v in got):
        raise ValueError(f"{op}: every `{what}` value must be >= {minimum}, got {got}.")
    return got


def _check_spatial_rank(op: str, t: Tensor) -> None:
    if t.rank < 3:
        raise core_error(
            f"{op}: expected an input (N, C, *spatial) of rank >= 3, got shape {t.shape}."
        )


def _window(
    d: int, k: int, s: int, dil: int, lo: int, hi: int, pad_type: str, ceil_mode: bool = False
) -> tuple[int, int, int]:
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
        raise core_error(
            EMPTY_OUTPUT_MSG.format(op=op, kernel=tuple(kernel), dilation=dilation, spatial=spatial)
        )
    return windows
