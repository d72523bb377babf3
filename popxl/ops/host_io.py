"""Host IO: ``host_load`` / ``host_store``, and ``init`` (a fresh tensor)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from .. import context
from .._op import core_error, define
from ..dtypes import dtype as DType
from ..streams import DeviceToHostStream, HostToDeviceStream
from ..tensor import Tensor
from ._base import jnp, record, spec


def _init_infer(
    *, shape: tuple[int, ...], dtype: DType, meta_shape: tuple[int, ...], init_type: str
) -> list:
    return [spec(shape, dtype, meta_shape)]


def _init(
    *, shape: tuple[int, ...], dtype: DType, meta_shape: tuple[int, ...], init_type: str
) -> Any:
    # 'undef' memory is unspecified on the IPU; zeros keep runs deterministic.
    return jnp.zeros(shape, dtype._np_device)


INIT = define("init", "Init", _init_infer, _init, grad="none")
HOST_LOAD = define(
    "host_load", "HostLoad", lambda t, **_: [t], special="host_load", effect=True, grad="none"
)
HOST_STORE = define(
    "host_store", "HostStore", lambda t, **_: [], special="host_store", effect=True, grad="none"
)


def init(
    shape: Iterable[int],
    dtype: DType,
    name: str | None = None,
    init_type: Literal["zero", "undef"] = "zero",
    meta_shape: Iterable[int] | None = None,
) -> Tensor:
    """A new tensor in the current graph, zero-filled (``"zero"``) or uninitialised
    (``"undef"``, which this runtime also fills with zeros)."""
    if init_type not in ("zero", "undef"):
        raise ValueError(f"init_type must be 'zero' or 'undef', got {init_type!r}.")
    attrs = {
        "shape": tuple(int(d) for d in shape),
        "dtype": dtype,
        "meta_shape": tuple(meta_shape or ()),
        "init_type": init_type,
    }
    return record(INIT, {}, attrs, [name or "t"])[0]


def host_load(h2d_stream: HostToDeviceStream, name: str | None = None) -> Tensor:
    """The next value of ``h2d_stream`` (one transfer of its per-run data).

    Usable in any graph. Each execution reads the next of the stream's
    ``num_host_transfers`` slots, wrapping around.
    """
    if not isinstance(h2d_stream, HostToDeviceStream):
        raise TypeError(f"host_load needs a HostToDeviceStream, got {type(h2d_stream).__name__}.")
    context.get_current_graph()
    name = name or h2d_stream._handle.name
    buffer = init(h2d_stream.shape, h2d_stream.dtype, f"{name}_init", "undef")
    attrs = {"stream_id": h2d_stream.tensor_id}
    out = record(HOST_LOAD, {"t": buffer}, attrs, [f"{name}_hostload"])[0]
    h2d_stream._used = True
    return out


def host_store(d2h_stream: DeviceToHostStream, t: Tensor) -> None:
    """Send ``t`` to the host through ``d2h_stream`` (shape and dtype must match the stream)."""
    if not isinstance(d2h_stream, DeviceToHostStream):
        raise TypeError(f"host_store needs a DeviceToHostStream, got {type(d2h_stream).__name__}.")
    if isinstance(t, Tensor) and (t.shape != d2h_stream.shape or t.dtype is not d2h_stream.dtype):
        raise ValueError(
            f"Tensor {t.id} ({t.dtype.name}{t.shape}) does not match stream "
            f"{d2h_stream.tensor_id} ({d2h_stream.dtype.name}{d2h_stream.shape}). Reshape or "
            "cast it, or create the stream with the tensor's shape and dtype."
        )
    record(HOST_STORE, {"t": t}, {"stream_id": d2h_stream.tensor_id}, [])
    d2h_stream._used = True


del core_error
