"""Host-side float8 conversion.

Float8 host data is PopXL's NumPy form: a structured dtype of one raw byte per element,
``popxl.dtypes.np_dtype_float8_143`` (``np.dtype([("float8_143", "u1")])``) or
``np_dtype_float8_152``. The formats: ``float8_143`` has 1 sign, 4 exponent and 3 mantissa
bits, bias 8, largest 240; ``float8_152`` 1/5/2, bias 16, largest 57344. Neither has
infinities; the byte ``0x80`` is the only NaN. NumPy compares structured arrays byte by byte,
so ``np.testing.assert_equal`` finds float8 NaNs equal, as in PopXL.

Deliberate extension: wherever float8 data goes in (these functions, ``popxl.variable``,
``popxl.constant``, stream inputs, ``Session.write_variable_data``) arrays of the matching
``ml_dtypes`` types (``float8_e4m3fnuz`` / ``float8_e5m2fnuz``, the same bytes) are accepted
too; data coming back is always the structured form (``popxl._float8_host`` converts by views).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import ml_dtypes
import numpy as np

from . import _float8_host, dtypes

if TYPE_CHECKING:
    from .dtypes import dtype as DType


class FpDef(NamedTuple):
    """A float8 format: exponent bits, mantissa bits, exponent bias, and NaN/inf flags."""

    num_exp_bits: int
    num_mantissa_bits: int
    bias: int
    has_nan_at_neg_zero: bool
    has_inf: bool


float8_143_def = FpDef(4, 3, 8, True, False)
float8_152_def = FpDef(5, 2, 16, True, False)

_FLOAT_SOURCES = (np.float16, np.float32, np.float64)


def _float8_max(dt: DType) -> float:
    return float(ml_dtypes.finfo(dt._np_device).max)


def _check_fp8_dtype(dt: DType | None) -> DType:
    if dt is None:
        return dtypes.float8_143
    if dt not in (dtypes.float8_143, dtypes.float8_152):
        raise TypeError(f"Expected a float8 dtype (float8_143 or float8_152), got {dt}.")
    return dt


def host_pow2scale_cast_to_fp8(
    src: Any, dtype: DType | None = None, log2_scale: int = 0, nan_on_overflow: bool = True
) -> np.ndarray:
    """Cast float data to float8 after multiplying by ``2**log2_scale``.

    Rounds to nearest even. Scaled values beyond the format's largest value (240 for
    float8_143, 57344 for float8_152) become NaN with ``nan_on_overflow``, else saturate to
    it; NaN and infinite inputs always become NaN (the byte ``0x80``), as PopART did.

    Args:
        src: float16/32/64 data (NumPy arrays, torch tensors, scalars, lists).
        dtype: ``popxl.float8_143`` (default) or ``popxl.float8_152``.
        log2_scale: int in ``[-32, 32)``.
        nan_on_overflow: NaN rather than saturation for out-of-range values.

    Returns:
        An array of the structured float8 dtype of ``dtype`` (``dtype.as_numpy()``, e.g.
        ``np_dtype_float8_143``), shaped like ``src``.

    Raises:
        TypeError: non-float data or a non-float8 ``dtype``.
        ValueError: ``log2_scale`` out of range.

    >>> import numpy as np, popxl
    >>> from popxl.fp8_utils import host_pow2scale_cast_to_fp8
    >>> x = np.array([0.75, 250.0, np.inf], np.float32)
    >>> host_pow2scale_cast_to_fp8(x, popxl.float8_143, 0, False)
    array([( 60,), (127,), (128,)], dtype=[('float8_143', 'u1')])
    >>> host_pow2scale_cast_to_fp8(x, popxl.float8_143, 0, True).view(np.uint8)
    array([ 60, 128, 128], dtype=uint8)
    """
    dt = _check_fp8_dtype(dtype)
    arr = np.asarray(src)
    if arr.dtype.type not in _FLOAT_SOURCES:
        raise TypeError(
            f"Float8 data must be converted from float16/32/64 data, got {arr.dtype}. "
            "Cast the array to a float type first."
        )
    if not -32 <= int(log2_scale) < 32:
        raise ValueError(f"log2_scale must be in [-32, 32), got {log2_scale}.")
    scaled = arr.astype(np.float64) * (2.0 ** int(log2_scale))
    limit = _float8_max(dt)
    with np.errstate(invalid="ignore"):
        if nan_on_overflow:
            scaled = np.where(np.abs(scaled) > limit, np.nan, scaled)
        else:
            # PopART saturates finite values only: infinities (e.g. float16 data that
            # overflowed already) still become NaN, the formats having no infinity.
            scaled = np.where(np.isinf(scaled), np.nan, np.clip(scaled, -limit, limit))
    return _float8_host.to_structured(scaled.astype(np.float32).astype(dt._np_device))


NOT_FLOAT8_MSG = (
    "Expected float8 host data: an array of dtype popxl.dtypes.np_dtype_float8_143 or "
    "np_dtype_float8_152 (as host_pow2scale_cast_to_fp8 returns) or of the matching ml_dtypes "
    "type (float8_e4m3fnuz, float8_e5m2fnuz); got dtype {got}."
)
NOT_FLOAT8_SOURCE_MSG = (
    "Data for a {want} tensor must be float8 data (an array of dtype "
    "popxl.dtypes.np_dtype_{want} as host_pow2scale_cast_to_fp8 returns, or of the ml_dtypes "
    "type {ml}) or float16/32/64 data to convert; got dtype {got}."
)
UNKNOWN_FLOAT8_MSG = (
    "The data's dtype {claimed} looks like float8 but it converts to a NumPy array of dtype "
    "{got}; pass dtype=popxl.float8_143 or popxl.float8_152 to say which format it holds."
)


def host_pow2scale_cast_from_fp8(
    src: np.ndarray, dtype: DType | None = None, log2_scale: int = 0
) -> np.ndarray:
    """Cast float8 data to ``dtype`` (float16/32/64) and multiply by ``2**log2_scale``.

    Args:
        src: float8 data: the structured ``np_dtype_float8_*`` form, or ml_dtypes float8.
        dtype: ``popxl.float16``, ``float32`` (default) or ``float64``.
        log2_scale: the power of two to multiply by after the cast.

    Raises:
        TypeError: ``src`` is not float8 data, or another ``dtype``.

    >>> import numpy as np, popxl
    >>> from popxl.fp8_utils import host_pow2scale_cast_from_fp8
    >>> raw = np.array([60, 128], np.uint8).view(popxl.dtypes.np_dtype_float8_143)
    >>> host_pow2scale_cast_from_fp8(raw, popxl.float32, 1)
    array([1.5, nan], dtype=float32)
    """
    target = dtypes.float32 if dtype is None else dtype
    if target not in (dtypes.float16, dtypes.float32, dtypes.float64):
        raise TypeError(f"Float8 data can only be cast to float16/32/64, not {target}.")
    arr = np.asarray(src)
    if not _float8_host.is_float8(arr.dtype):
        raise TypeError(NOT_FLOAT8_MSG.format(got=arr.dtype))
    out = _float8_host.to_ml(arr).astype(np.float64) * (2.0 ** int(log2_scale))
    return out.astype(target.as_numpy())


def _to_float8_array(
    x: Any,
    dt: DType | None,
    log2_scale: int | None,
    nan_on_overflow: bool | None,
    copy: bool = True,
) -> np.ndarray:
    """Data for a float8 tensor (``dt``; None: the format of float8 data ``x``), structured.

    Float8 data of either form is taken as is (log2_scale and nan_on_overflow do not apply);
    float16/32/64 data is converted with ``host_pow2scale_cast_to_fp8``.
    """
    if isinstance(x, np.memmap):
        arr: np.ndarray = x
    elif type(x).__module__.startswith("torch"):
        arr = np.asarray(x.detach().cpu().numpy())
    else:
        arr = np.asarray(x)
    if _float8_host.is_float8(arr.dtype):
        want = _float8_host.popxl_dtype(arr.dtype) if dt is None else dt
        out = _float8_host.checked_structured(arr, want)
        return out.copy() if copy else out
    if dt is None:
        raise TypeError(UNKNOWN_FLOAT8_MSG.format(claimed=getattr(x, "dtype", None), got=arr.dtype))
    if arr.dtype.type not in _FLOAT_SOURCES:
        raise TypeError(NOT_FLOAT8_SOURCE_MSG.format(want=dt.name, ml=dt._np_device, got=arr.dtype))
    return host_pow2scale_cast_to_fp8(
        arr,
        dt,
        0 if log2_scale is None else log2_scale,
        True if nan_on_overflow is None else nan_on_overflow,
    )


def host_fp8_mse_scale(src: np.ndarray, dtype: DType | None = None) -> tuple[float, int]:
    """The float8 scale that loses least information when casting ``src``, by MSE.

    Returns ``(metric, s)`` such that ``cast(src * 2**s, dtype)`` has the smallest estimated
    squared error (``metric``) among ``s`` in ``[-31, 31]``; see ``popxl._fp8_scale``.
    Deliberate fix: the original estimated the error of saturating values against an edge
    that did not move with the candidate scale.

    Args:
        src: float16 or float32 data.
        dtype: ``float8_143`` (default) or ``float8_152``.

    Raises:
        RuntimeError: ``src`` is not float16 or float32.
    """
    from ._fp8_scale import host_mse_scale  # noqa: PLC0415

    if src.dtype not in (np.float16, np.float32):
        raise RuntimeError(f"dtype {src.dtype} not currently supported.")
    return host_mse_scale(np.asarray(src), _check_fp8_dtype(dtype).name)


__all__ = [
    "FpDef",
    "host_fp8_mse_scale",
    "float8_143_def",
    "float8_152_def",
    "host_pow2scale_cast_to_fp8",
    "host_pow2scale_cast_from_fp8",
]
