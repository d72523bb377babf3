"""Host streams: how data moves between the host and a running program."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from . import context
from . import dtypes as _dtypes
from .tensor import Tensor
from .tensor_spec import TensorSpec

if TYPE_CHECKING:
    from .dtypes import dtype as DType


class Stream:
    """A host stream. Each has a handle tensor in the main graph."""

    _is_h2d: bool
    _handle: Tensor
    _used: bool

    def __init__(self) -> None:
        raise NotImplementedError(
            "Streams cannot be constructed directly; use popxl.h2d_stream or popxl.d2h_stream."
        )

    @classmethod
    def _create(cls, handle: Tensor) -> Stream:
        self = object.__new__(cls)
        self._handle = handle
        self._used = False
        handle._stream = self
        handle.ir._streams.append(self)
        return self

    @property
    def dtype(self) -> DType:
        return self._handle.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._handle.shape

    @property
    def spec(self) -> TensorSpec:
        return self._handle.spec

    @property
    def tensor_id(self) -> str:
        return self._handle.id

    def __hash__(self) -> int:
        return hash(self._handle)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._handle is self._handle

    def __str__(self) -> str:
        return f"{type(self).__name__} {self._handle!r}"

    __repr__ = __str__


class HostToDeviceStream(Stream):
    """Data sent from the host; read on the device with ``ops.host_load``."""

    _is_h2d = True


class DeviceToHostStream(Stream):
    """Data sent to the host; written on the device with ``ops.host_store``."""

    _is_h2d = False


BAD_DTYPE_MSG = (
    "{fn}: dtype must be a popxl dtype (e.g. popxl.float32), got {got!r} of type {kind}.{hint}"
)


def _check_dtype(fn: str, dtype: Any) -> None:
    if isinstance(dtype, _dtypes.dtype):
        return
    hint = ""
    if isinstance(dtype, str):
        known = _dtypes.dtype._by_name.get(dtype)
        close = difflib.get_close_matches(dtype, list(_dtypes.dtype._by_name), n=1)
        name = known.name if known is not None else (close[0] if close else None)
        if name is not None:
            hint = f" Did you mean popxl.{name}?"
    raise TypeError(BAD_DTYPE_MSG.format(fn=fn, got=dtype, kind=type(dtype).__name__, hint=hint))


def _stream(cls: type[Stream], shape: Iterable[int], dtype: DType, name: str | None) -> Stream:
    _check_dtype("h2d_stream" if cls._is_h2d else "d2h_stream", dtype)
    main = context.get_main_graph()
    spec = TensorSpec(tuple(shape), dtype)
    with main:
        handle = Tensor._create(main, main._create_tensor_id(name), spec)
    return cls._create(handle)


def h2d_stream(shape: Iterable[int], dtype: DType, name: str | None = None) -> HostToDeviceStream:
    """A host-to-device stream of tensors of ``shape`` and ``dtype`` (name default ``h2d_stream``).

    Raises:
        TypeError: ``dtype`` is not a ``popxl.dtype`` (a string such as ``"float32"`` too).
    """
    return _stream(HostToDeviceStream, shape, dtype, name or "h2d_stream")  # type: ignore[return-value]


def d2h_stream(shape: Iterable[int], dtype: DType, name: str | None = None) -> DeviceToHostStream:
    """A device-to-host stream of tensors of ``shape`` and ``dtype`` (name default ``d2h_stream``).

    Raises:
        TypeError: ``dtype`` is not a ``popxl.dtype`` (a string such as ``"float32"`` too).
    """
    return _stream(DeviceToHostStream, shape, dtype, name or "d2h_stream")  # type: ignore[return-value]


__all__ = ["HostToDeviceStream", "DeviceToHostStream", "h2d_stream", "d2h_stream"]
