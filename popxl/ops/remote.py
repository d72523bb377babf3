"""Remote-buffer IO: ``remote_load``, ``remote_load_`` and ``remote_store``.

Loads and stores of the same slot have no data dependency between them; they run in the
order they were created (use ``popxl.in_sequence()`` to make that order explicit, as on
the IPU).
"""

from __future__ import annotations

from typing import Any

from .. import context, dtypes
from .._op import define
from ..remote_buffer import RemoteBuffer
from ..tensor import Tensor, constant
from ._base import check_in_graph, record
from .host_io import init


def _loaded_infer(t: Any, offset: Any, **_: Any) -> list:
    return [t]


REMOTE_LOAD = define(
    "remote_load", "RemoteLoad", _loaded_infer, special="remote_load", effect=True, grad="none"
)
REMOTE_LOAD_ = define(
    "remote_load_",
    "RemoteLoadInplace",
    _loaded_infer,
    special="remote_load",
    effect=True,
    grad="none",
    modifies=((0, 0),),
    alias_outputs=((0, 0),),
)
REMOTE_STORE = define(
    "remote_store",
    "RemoteStore",
    lambda t, offset, **_: [],
    special="remote_store",
    effect=True,
    grad="none",
)


def _offset_tensor(offset: int | Tensor) -> Tensor:
    if isinstance(offset, Tensor):
        check_in_graph(context.get_current_graph(), offset=offset)
        if not offset.dtype.is_int or offset.nelms != 1:
            raise ValueError(f"offset must be a single-element integer tensor, got {offset}.")
        return offset
    return constant(int(offset), dtypes.uint32, "offset")


def _load(remote_buffer: RemoteBuffer, offset: int | Tensor, name: str, out_name: str) -> Tensor:
    offset_t = _offset_tensor(offset)
    buffer = init(
        remote_buffer.tensor_shape,
        remote_buffer.tensor_dtype,
        f"{name}_remote_load",
        "undef",
        remote_buffer.meta_shape,
    )
    attrs = {"buffer_id": remote_buffer.remote_buffer_id}
    return record(REMOTE_LOAD, {"t": buffer, "offset": offset_t}, attrs, [out_name])[0]


def remote_load(
    remote_buffer: RemoteBuffer, offset: int | Tensor, name: str | None = None
) -> Tensor:
    """Slot ``offset`` of this replica's copy of ``remote_buffer`` (with the buffer's
    meta-shape, so a replica-sharded slot loads as a shard)."""
    offset_t = _offset_tensor(offset)
    name = name or f"id_{remote_buffer.remote_buffer_id}_offset_{offset_t.name}"
    return _load(remote_buffer, offset_t, name, f"{name}_remote_loaded")


def remote_load_(remote_buffer: RemoteBuffer, offset: int | Tensor, t: Tensor) -> Tensor:
    """Load slot ``offset`` into the existing tensor ``t`` (overwriting its storage)."""
    remote_buffer.validate_tensor_matches_buffer(t)
    attrs = {"buffer_id": remote_buffer.remote_buffer_id}
    inputs = {"t": t, "offset": _offset_tensor(offset)}
    return record(REMOTE_LOAD_, inputs, attrs, ["remote_load_inplace_out"])[0]


def remote_store(remote_buffer: RemoteBuffer, offset: int | Tensor, t: Tensor) -> None:
    """Write ``t`` into slot ``offset`` of this replica's copy of ``remote_buffer``.

    Raises:
        ValueError: ``t``'s shape or dtype differs from the buffer's.
    """
    check_in_graph(context.get_current_graph(), t=t)
    remote_buffer.validate_tensor_matches_buffer(t)
    attrs = {"buffer_id": remote_buffer.remote_buffer_id}
    record(REMOTE_STORE, {"t": t, "offset": _offset_tensor(offset)}, attrs, [])


__all__ = ["remote_load", "remote_load_", "remote_store"]
