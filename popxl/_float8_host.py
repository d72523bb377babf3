"""Float8 host data at the boundary between the user and the runtime.

Users see PopXL's form: a structured NumPy dtype of one ``u1`` field named after the format
(``popxl.dtypes.np_dtype_float8_143`` / ``np_dtype_float8_152``). The runtime and JAX hold the
same bytes as the ``ml_dtypes`` float8 types (``float8_e4m3fnuz`` / ``float8_e5m2fnuz``).
Every conversion here is a NumPy ``view``: no copy, and writes through a view reach the
original array (a memmap stays a memmap).

Never convert between the two forms with ``astype`` or element assignment: NumPy would
convert the *values* (``1.0`` becoming the byte ``1``), not reinterpret the bytes.

>>> import numpy as np, ml_dtypes
>>> ml = np.array([1.0, np.nan], ml_dtypes.float8_e4m3fnuz)
>>> to_structured(ml)
array([( 64,), (128,)], dtype=[('float8_143', 'u1')])
>>> to_ml(to_structured(ml)).dtype
dtype(float8_e4m3fnuz)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import dtypes

if TYPE_CHECKING:
    from .dtypes import dtype as DType

_STRUCTURED = {
    dtypes.np_dtype_float8_143: dtypes._ml_dtype_float8_143,
    dtypes.np_dtype_float8_152: dtypes._ml_dtype_float8_152,
}
_ML = {ml: structured for structured, ml in _STRUCTURED.items()}

WRONG_FORMAT_MSG = (
    "The data holds {have} values but the tensor is {want}. Float8 data is never converted "
    "between the two formats implicitly: cast it back to float (host_pow2scale_cast_from_fp8) "
    "and then to {want} (host_pow2scale_cast_to_fp8)."
)


def is_float8(np_dtype: np.dtype | None) -> bool:
    """Whether ``np_dtype`` is float8 data in either form (structured or ml_dtypes)."""
    return np_dtype in _STRUCTURED or np_dtype in _ML


def popxl_dtype(np_dtype: np.dtype) -> DType:
    """The popxl float8 dtype of float8 NumPy data in either form."""
    return dtypes.dtype.as_dtype(np_dtype)


def to_structured(arr: np.ndarray) -> np.ndarray:
    """``arr`` in PopXL's structured form if it is ml_dtypes float8 data, else ``arr``."""
    structured = _ML.get(arr.dtype)
    return arr if structured is None else arr.view(structured)


def to_ml(arr: np.ndarray) -> np.ndarray:
    """``arr`` as ml_dtypes float8 data if it is in the structured form, else ``arr``."""
    ml = _STRUCTURED.get(arr.dtype)
    return arr if ml is None else arr.view(ml)


def checked_structured(arr: np.ndarray, want: DType) -> np.ndarray:
    """Float8 data of either form as a structured view, after checking it holds ``want``.

    Raises:
        TypeError: the data is the other float8 format.
    """
    have = popxl_dtype(arr.dtype)
    if have != want:
        raise TypeError(WRONG_FORMAT_MSG.format(have=have.name, want=want.name))
    return to_structured(arr)


__all__ = ["is_float8", "popxl_dtype", "to_structured", "to_ml", "checked_structured"]
