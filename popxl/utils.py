"""Host-side helpers: converting user data to NumPy, formatting tables for errors."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

# PopXL exposes the float8 host dtypes here too.
from .dtypes import np_dtype_float8_143 as np_dtype_float8_143
from .dtypes import np_dtype_float8_152 as np_dtype_float8_152

if TYPE_CHECKING:
    from .dtypes import dtype as DType

downcast_np_dtypes = {
    np.dtype(np.int64): np.dtype(np.int32),
    np.dtype(np.uint64): np.dtype(np.uint32),
    np.dtype(np.float64): np.dtype(np.float32),
}
HW_DEVICE_CONNECTION_TIMEOUT = 10000

_FP8_SCALE_ONLY_MSG = (
    "`log2_scale` and `nan_on_overflow` only apply to float8 data; got dtype {dtype}. "
    "Remove these arguments or pass a float8 dtype."
)


def _python_scalar_dtype(x: Any) -> np.dtype | None:
    if isinstance(x, bool):
        return np.dtype(np.bool_)
    if isinstance(x, int):
        return np.dtype(np.int32)
    if isinstance(x, float):
        return np.dtype(np.float32)
    return None


def _as_array(x: Any) -> np.ndarray:
    """``np.asarray`` that also takes torch tensors: detached (so tensors that require grad
    work), on the CPU, contiguous; bfloat16 and float8 tensors, which NumPy cannot hold
    natively, come back as ml_dtypes arrays of the same values."""
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu().contiguous()
        ml_type = _ML_DTYPE_OF_TORCH.get(str(x.dtype))
        if ml_type is not None:
            torch = sys.modules["torch"]  # loaded: x is one of its tensors
            bits = x.view(getattr(torch, _TORCH_BITS_OF_SIZE[x.element_size()]))
            return bits.numpy().view(ml_type)
        return x.numpy()
    return np.asarray(x)


_ML_DTYPE_OF_TORCH = {
    "torch.bfloat16": ml_dtypes.bfloat16,
    "torch.float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "torch.float8_e5m2": ml_dtypes.float8_e5m2,
}
_TORCH_BITS_OF_SIZE = {2: "int16", 1: "int8"}


def to_numpy(
    x: Any,
    dtype: DType | None = None,
    downcast: bool = True,
    copy: bool = True,
    log2_scale: int | None = None,
    nan_on_overflow: bool | None = None,
) -> np.ndarray:
    """Convert host data (arrays, torch tensors, scalars, nested lists) to a NumPy array.

    Args:
        x: the data.
        dtype: the popxl dtype to convert to; inferred when None.
        downcast: with no ``dtype``, turn 64-bit ints/floats into their 32-bit types.
        copy: copy the data even when no conversion is needed.
        log2_scale: float8 only: data is multiplied by ``2**log2_scale`` before the cast.
        nan_on_overflow: float8 only: values out of range become NaN rather than saturate.

    Returns:
        A NumPy array. Python ints become int32, floats float32, bools bool. Float8 data is
        PopXL's structured form (``np_dtype_float8_143``/``_152``); float8 input may be that
        form or ml_dtypes float8 arrays (the same bytes).

    Raises:
        RuntimeError: float8-only arguments given for another dtype.
        TypeError: float8 requested from data that is neither float8 nor float16/32/64, or
            float8 data of the other format.
    """
    from . import _float8_host, fp8_utils  # noqa: PLC0415  (fp8_utils imports this module)

    float8_data = dtype is None and _float8_host.is_float8(getattr(x, "dtype", None))
    if float8_data or (dtype is not None and dtype.name.startswith("float8")):
        arr = fp8_utils._to_float8_array(x, dtype, log2_scale, nan_on_overflow, copy)
        return _checked_memmap(arr, None, downcast) if isinstance(arr, np.memmap) else arr
    if log2_scale is not None or nan_on_overflow is not None:
        raise RuntimeError(_FP8_SCALE_ONLY_MSG.format(dtype=dtype))
    if isinstance(x, np.memmap) and not copy:
        return _checked_memmap(x, dtype, downcast)
    scalar_dt = _python_scalar_dtype(x)
    if dtype is not None:
        arr = np.array(_as_array(x), dtype=dtype.as_numpy(), copy=copy or None)
        return arr
    if scalar_dt is not None:
        return np.array(x, dtype=scalar_dt)
    if isinstance(x, (list, tuple)):
        arr = np.array(x)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        elif arr.dtype == np.int64:
            arr = arr.astype(np.int32)
    else:
        arr = _as_array(x)
    if downcast and arr.dtype in downcast_np_dtypes:
        return arr.astype(downcast_np_dtypes[arr.dtype])
    return arr.copy() if copy else arr


MEMMAP_DTYPE_MSG = (
    "When passing a memory-mapped NumPy array, the `dtype` parameter must be None or the same "
    "as the array's dtype; the array has {have} but {want} was requested. Memory-mapped data "
    "is used in place and never converted: create the np.memmap with dtype {want_np}, or "
    "leave `dtype` out."
)
MEMMAP_LAYOUT_MSG = (
    "When passing a memory-mapped NumPy array, it must already be in C-ordered and aligned "
    "form, because it is used in place. Create the np.memmap with order='C' (the default)."
)
MEMMAP_DOWNCAST_MSG = (
    "When passing a memory-mapped NumPy array, the dtype {dtype} is not supported, as it "
    "requires downcasting the array into a new array with a dtype supported by PopXL "
    "(the array has {have}). Create the np.memmap with {narrow}, or pass downcast=False to "
    "use the 64-bit data in place."
)


def _checked_memmap(x: np.memmap, dtype: DType | None, downcast: bool) -> np.ndarray:
    """A memmap usable in place, checked in PopXL's order (dtype, layout, downcasting)."""
    if dtype is not None and x.dtype != dtype.as_numpy():
        raise ValueError(
            MEMMAP_DTYPE_MSG.format(have=x.dtype, want=dtype, want_np=dtype.as_numpy())
        )
    if not (x.flags.c_contiguous and x.flags.aligned):
        raise ValueError(MEMMAP_LAYOUT_MSG)
    if downcast and x.dtype in downcast_np_dtypes:
        raise ValueError(
            MEMMAP_DOWNCAST_MSG.format(
                dtype=dtype, have=x.dtype, narrow=downcast_np_dtypes[x.dtype]
            )
        )
    return x


def table_to_string(
    rows: Sequence[Sequence[Any]], delimiter: str = " | ", header: bool = True
) -> str:
    """Format rows as an aligned text table (used in error messages)."""
    rows = [[str(c) for c in row] for row in rows]
    if not rows:
        return ""
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        line = delimiter.join(c.ljust(w) for c, w in zip(row, widths)) + "\n"
        lines.append(line)
        if header and n == 0:
            lines.append("-" * len(line) + "\n")
    return "".join(lines)


def flatten_once(items: Iterable[Any]) -> list[Any]:
    """Expand every non-string iterable element one level (how ``ops.call`` reads inputs)."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, Iterable) and not isinstance(item, (str, bytes)):
            out.extend(item)
        else:
            out.append(item)
    return out


__all__ = [
    "to_numpy",
    "table_to_string",
    "downcast_np_dtypes",
    "HW_DEVICE_CONNECTION_TIMEOUT",
    "np_dtype_float8_143",
    "np_dtype_float8_152",
]


def _to_device_info(device_type: str, num_ipus: int = 1, use_popdist: bool = False) -> Any:
    """A device object (PopART's ``DeviceInfo`` interface) of ``device_type`` with
    ``num_ipus`` IPUs, for ``popxl.Session(ir, device)`` or ``session._set_device``.

    Raises:
        ValueError: an unknown device type, or a ``"cpu"`` device of more than one IPU.
    """
    from runtime.devices.device import DeviceInfo  # noqa: PLC0415 (popxl never imports runtime eagerly)

    del use_popdist
    if device_type == "cpu" and num_ipus > 1:
        raise ValueError(
            f"For a cpu device, multiple devices (provided: {num_ipus}) are not supported."
        )
    return DeviceInfo(device_type, num_ipus)


def __getattr__(name: str) -> Any:
    # PopXL kept its float8 host conversions here; they live in `fp8_utils` (which imports
    # this module, hence the lazy lookup).
    if name in ("host_pow2scale_cast_to_fp8", "host_pow2scale_cast_from_fp8"):
        from . import fp8_utils  # noqa: PLC0415

        return getattr(fp8_utils, name)
    raise AttributeError(f"module 'popxl.utils' has no attribute '{name}'")
