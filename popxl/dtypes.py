"""PopXL data types.

Each dtype is a singleton (``popxl.float32 is popxl.dtypes.float32``); compare with ``==``
or ``is``.

Float8 host data uses PopXL's NumPy form: a structured dtype of one ``u1`` field named after
the format (``np_dtype_float8_143 = np.dtype([("float8_143", "u1")])``), one raw byte per
element. That is what ``as_numpy()`` gives and what sessions hand back; NumPy compares such
arrays byte by byte, so a NaN (the byte ``0x80``) equals itself in
``np.testing.assert_equal``. Inputs may also be arrays of the matching ``ml_dtypes`` type
(``float8_143`` is ``float8_e4m3fnuz``, ``float8_152`` is ``float8_e5m2fnuz``: the same
formats as the IPU's), which the runtime and JAX use internally; see ``popxl._float8_host``.

>>> import popxl
>>> popxl.float32
popxl.dtypes.float32
>>> popxl.dtypes.dtype.as_dtype("int8") is popxl.int8
True
"""

from __future__ import annotations

import builtins
from typing import Any

import ml_dtypes
import numpy as np

np_dtype_float8_143 = np.dtype([("float8_143", "u1")])
np_dtype_float8_152 = np.dtype([("float8_152", "u1")])
# The same formats as ml_dtypes types: the runtime's (and JAX's) view of float8 data.
_ml_dtype_float8_143 = np.dtype(ml_dtypes.float8_e4m3fnuz)
_ml_dtype_float8_152 = np.dtype(ml_dtypes.float8_e5m2fnuz)

_NO_DTYPE_MSG = "There is not a popxl.dtype that is compatible with value: `{!r}`."


class dtype:
    """A PopXL element type. Instances are the module-level singletons."""

    _by_name: dict[str, dtype] = {}
    _by_numpy: dict[np.dtype, dtype] = {}
    _name: str
    _np: np.dtype
    _np_device: np.dtype
    _is_int: builtins.bool
    _is_float: builtins.bool
    _is_signed: builtins.bool
    _is_complex: builtins.bool
    _torch_name: str | None

    def __init__(self) -> None:
        raise TypeError("Cannot create popxl.dtypes.dtype instances.")

    @classmethod
    def _new(
        cls,
        name: str,
        np_type: Any,
        *,
        is_int: builtins.bool = False,
        is_float: builtins.bool = False,
        is_signed: builtins.bool = True,
        is_complex: builtins.bool = False,
        torch_name: str | None = None,
        device_np_type: Any = None,
    ) -> dtype:
        self = object.__new__(cls)
        self._name = name
        self._np = np.dtype(np_type)
        # The dtype of device (JAX) arrays; differs from the host one for float8 only.
        self._np_device = self._np if device_np_type is None else np.dtype(device_np_type)
        self._is_int = is_int
        self._is_float = is_float
        self._is_signed = is_signed
        self._is_complex = is_complex
        self._torch_name = torch_name
        cls._by_name[name] = self
        cls._by_numpy.setdefault(self._np, self)
        cls._by_numpy.setdefault(self._np_device, self)
        return self

    @property
    def name(self) -> str:
        return self._name

    @property
    def is_complex(self) -> builtins.bool:
        return self._is_complex

    @property
    def is_int(self) -> builtins.bool:
        return self._is_int

    @property
    def is_floating_point(self) -> builtins.bool:
        return self._is_float

    @property
    def is_signed(self) -> builtins.bool:
        return self._is_signed

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self._np.itemsize

    def as_numpy(self) -> np.dtype:
        """The NumPy dtype used for host data of this type (``np_dtype_float8_*`` for float8)."""
        return self._np

    def as_torch(self) -> Any:
        """The matching ``torch.dtype``; raises if torch is missing or has no such type."""
        import torch  # noqa: PLC0415  (optional dependency)

        if self._torch_name is None:
            raise TypeError(f"{self!r} has no torch equivalent.")
        return getattr(torch, self._torch_name)

    @classmethod
    def from_name(cls, name: str) -> dtype:
        try:
            return cls._by_name[name]
        except KeyError:
            raise ValueError(
                f"'{name}' is not a popxl dtype name. Valid names: {sorted(cls._by_name)}"
            ) from None

    @classmethod
    def as_dtype(cls, type_value: Any) -> dtype:
        """Map a name, Python type, NumPy/torch dtype or array onto a popxl dtype."""
        if isinstance(type_value, dtype):
            # Deliberate difference: the original raised here; accepting is kinder.
            return type_value
        if isinstance(type_value, str) and type_value in cls._by_name:
            return cls._by_name[type_value]
        if type_value is builtins.bool:
            return cls._by_name["bool"]
        if type_value is builtins.float:
            return cls._by_name["float32"]
        torch_dtype = _torch_dtype_lookup(type_value)
        if torch_dtype is not None:
            return torch_dtype
        try:
            np_dt = np.dtype(type_value)
        except (TypeError, ValueError):  # NumPy raises ValueError for e.g. torch tensors
            np_dt = None
        if np_dt is not None and np_dt in cls._by_numpy:
            return cls._by_numpy[np_dt]
        inner = getattr(type_value, "dtype", None)
        if inner is not None and inner is not type_value:
            return cls.as_dtype(inner)
        raise ValueError(_NO_DTYPE_MSG.format(type_value))

    def __repr__(self) -> str:
        return f"popxl.dtypes.{self._name}"

    def __reduce__(self) -> tuple:
        return (dtype.from_name, (self._name,))

    def __copy__(self) -> dtype:
        return self

    def __deepcopy__(self, memo: dict) -> dtype:
        return self


def _torch_dtype_lookup(value: Any) -> dtype | None:
    module = type(value).__module__
    if not module.startswith("torch"):
        return None
    name = str(value).replace("torch.", "")
    for candidate in dtype._by_name.values():
        if candidate._torch_name == name:
            return candidate
    return None


bool = dtype._new("bool", np.bool_, is_signed=False, torch_name="bool")
int8 = dtype._new("int8", np.int8, is_int=True, torch_name="int8")
int16 = dtype._new("int16", np.int16, is_int=True, torch_name="int16")
int32 = dtype._new("int32", np.int32, is_int=True, torch_name="int32")
int64 = dtype._new("int64", np.int64, is_int=True, torch_name="int64")
uint8 = dtype._new("uint8", np.uint8, is_int=True, is_signed=False, torch_name="uint8")
uint16 = dtype._new("uint16", np.uint16, is_int=True, is_signed=False)
uint32 = dtype._new("uint32", np.uint32, is_int=True, is_signed=False)
uint64 = dtype._new("uint64", np.uint64, is_int=True, is_signed=False)
float8_143 = dtype._new(
    "float8_143", np_dtype_float8_143, is_float=True, device_np_type=_ml_dtype_float8_143
)
float8_152 = dtype._new(
    "float8_152", np_dtype_float8_152, is_float=True, device_np_type=_ml_dtype_float8_152
)
float16 = dtype._new("float16", np.float16, is_float=True, torch_name="float16")
float32 = dtype._new("float32", np.float32, is_float=True, torch_name="float32")
float64 = dtype._new("float64", np.float64, is_float=True, torch_name="float64")
complex64 = dtype._new("complex64", np.complex64, is_complex=True, torch_name="complex64")
complex128 = dtype._new("complex128", np.complex128, is_complex=True, torch_name="complex128")
half = float16
float = float32
double = float64

_SIXTY_FOUR_BIT = {"int64", "uint64", "float64", "complex128"}


def is_64_bit(dt: dtype) -> builtins.bool:
    """True for dtypes that need JAX's x64 mode on device."""
    return dt.name in _SIXTY_FOUR_BIT


__all__ = [
    "dtype",
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "half",
    "float8_143",
    "float8_152",
    "float16",
    "float",
    "float32",
    "double",
    "float64",
    "complex64",
    "complex128",
    "np_dtype_float8_143",
    "np_dtype_float8_152",
]
