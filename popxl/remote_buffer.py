"""Remote buffers (streaming memory) and the variables that live in them.

A ``RemoteBuffer`` is an array of ``entries`` slots of ``tensor_shape``, one independent
copy per replica, that keeps its contents across runs. ``ops.remote_load`` /
``ops.remote_store`` read and write slots. A *remote variable* lives in a slot: the session
writes its host value there (``weights_from_host``) and reads it back. A *replica-sharded*
(RTS) variable keeps one flat shard per replica: the full value, flattened and zero-padded
to a multiple of the shard count, split in equal chunks by the replica's rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from . import context
from . import dtypes as _dtypes
from .tensor import (
    HostScalarTensor,
    Tensor,
    Variable,
    _fp8_kwargs,
    _grouping_and_mode,
    _host_array,
    _init_variable,
    _per_group_shape,
)
from .tensor_spec import TensorSpec

if TYPE_CHECKING:
    from .dtypes import dtype as DType
    from .replica_grouping import ReplicaGrouping


class RemoteBuffer:
    """``entries`` slots of ``tensor_shape``/``tensor_dtype`` in streaming memory, per replica."""

    def __init__(self, tensor_shape: tuple[int, ...], tensor_dtype: DType, entries: int) -> None:
        ir = context.get_current_graph().ir
        self._ir = ir
        self._tensor_shape = tuple(int(d) for d in tensor_shape)
        self._tensor_dtype = tensor_dtype
        self.entries = entries
        self._meta_shape: tuple[int, ...] = ()
        self._shard_over: int | None = None
        existing = [b.remote_buffer_id for b in ir._remote_buffers]
        self._id = max(existing, default=0) + 1
        ir._remote_buffers.append(self)

    @property
    def remote_buffer_id(self) -> int:
        return self._id

    @property
    def tensor_shape(self) -> tuple[int, ...]:
        return self._tensor_shape

    @property
    def tensor_dtype(self) -> DType:
        return self._tensor_dtype

    @property
    def entries(self) -> int:
        return self._entries

    @entries.setter
    def entries(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"Entries must be a non-zero, positive integer. Got {value}")
        self._entries = value

    @property
    def meta_shape(self) -> tuple[int, ...]:
        """The full (unsharded) shape of the tensors held, for replica-sharded buffers."""
        return self._meta_shape

    @meta_shape.setter
    def meta_shape(self, shape: Iterable[int]) -> None:
        self._meta_shape = tuple(int(d) for d in shape)

    def set_remote_buffer_info(
        self, tensor_dtype: DType, tensor_shape: tuple[int, ...], entries: int
    ) -> None:
        self._tensor_dtype = tensor_dtype
        self._tensor_shape = tuple(tensor_shape)
        self.entries = entries

    def validate_tensor_matches_buffer(self, t: Tensor, num_shards: int = 1) -> None:
        """Raise ``ValueError`` unless ``t`` has this buffer's dtype and shape (or meta-shape)."""
        # With several shards PopXL compared the full shape with the meta-shape; a shard
        # (whose meta-shape is the full shape) matches too.
        shape_ok = t.shape == self._tensor_shape or (
            num_shards > 1
            and bool(self._meta_shape)
            and self._meta_shape in (t.shape, t.meta_shape)
        )
        if not shape_ok or t.dtype is not self._tensor_dtype:
            raise ValueError(
                f"Tensor does not match buffer.\nTensor {t.id}: {t.dtype.name}{t.shape} "
                f"(meta-shape {t.meta_shape}); buffer {self._id}: {self._tensor_dtype.name}"
                f"{self._tensor_shape} (meta-shape {self._meta_shape})."
            )

    def __hash__(self) -> int:
        return hash((self._ir.id, self._id))

    def __repr__(self) -> str:
        return (
            f"RemoteBuffer(id={self._id}, shape={self._tensor_shape}, dtype={self._tensor_dtype.name}, "
            f"entries={self._entries})"
        )


def remote_buffer(
    tensor_shape: tuple[int, ...], tensor_dtype: DType, entries: int = 1
) -> RemoteBuffer:
    """A new remote buffer of ``entries`` slots."""
    return RemoteBuffer(tensor_shape, tensor_dtype, entries)


def _main_graph_variable_args(data: Any, dtype: DType | None, downcast: bool, fp8: dict) -> tuple:
    graph = context.get_current_graph()
    from .tensor import VARIABLE_OUTSIDE_MAIN_MSG  # noqa: PLC0415

    if graph is not graph.ir.main_graph:
        raise ValueError(VARIABLE_OUTSIDE_MAIN_MSG.format(graph=graph))
    return graph, _host_array(data, dtype, downcast, **fp8)


def remote_variable(
    data: HostScalarTensor,
    remote_buffer: RemoteBuffer,
    offset: int = 0,
    dtype: DType | None = None,
    name: str | None = None,
    downcast: bool = True,
    replica_grouping: ReplicaGrouping | None = None,
    retrieval_mode: str | None = "one_per_group",
    log2_scale: int | None = None,
    nan_on_overflow: bool | None = None,
) -> Variable:
    """A variable whose value lives in slot ``offset`` of ``remote_buffer`` (per replica).

    Use ``ops.remote_load(remote_buffer, offset)`` to read it on the device and
    ``ops.remote_store`` to write it; the session reads and writes it like any variable.
    """
    graph, arr = _main_graph_variable_args(
        data, dtype, downcast, _fp8_kwargs(log2_scale, nan_on_overflow)
    )
    grouping, mode = _grouping_and_mode(graph.ir, replica_grouping, retrieval_mode)
    shape = _per_group_shape(arr, grouping, name)
    dt = dtype or _dtypes.dtype.as_dtype(arr.dtype)
    _check_offset(remote_buffer, offset)
    var = Variable._create(graph, graph._create_tensor_id(name), TensorSpec(shape, dt))
    var._remote_buffer = remote_buffer
    var._remote_offset = int(offset)
    _init_variable(var, arr, grouping, mode)
    return var


def _check_offset(buffer: RemoteBuffer, offset: int) -> None:
    if not 0 <= int(offset) < buffer.entries:
        raise ValueError(
            f"offset {offset} is out of range for {buffer} with {buffer.entries} entries."
        )


def remote_replica_sharded_variable(
    data: HostScalarTensor,
    remote_buffer: RemoteBuffer,
    offset: int = 0,
    dtype: DType | None = None,
    name: str | None = None,
    downcast: bool = True,
    replica_grouping: ReplicaGrouping | None = None,
    retrieval_mode: str | None = "one_per_group",
    log2_scale: int | None = None,
    nan_on_overflow: bool | None = None,
) -> Variable:
    """A replica-sharded variable in slot ``offset`` of ``remote_buffer``: each replica's slot
    holds one flat shard. Load a shard with ``ops.remote_load`` and use
    ``replicated_all_gather`` to get the full tensor.

    Raises:
        ValueError: replication factor 1, or a buffer meta-shape that differs from the data.
    """
    graph = context.get_current_graph()
    rf = graph.ir.replication_factor
    if rf <= 1:
        raise ValueError(
            f"The IR's global replication factor is {rf}. It must be greater than 1 to create a "
            "replica sharded variable."
        )
    var = remote_variable(
        data,
        remote_buffer,
        offset,
        dtype,
        name,
        downcast,
        replica_grouping,
        retrieval_mode,
        log2_scale,
        nan_on_overflow,
    )
    full = var.shape
    if remote_buffer.meta_shape and remote_buffer.meta_shape != full:
        raise ValueError(
            f"{remote_buffer} already holds tensors of meta-shape {remote_buffer.meta_shape}; "
            f"{var.id} has shape {full}."
        )
    remote_buffer.meta_shape = full
    shard_over = remote_buffer._shard_over or var.replica_grouping.group_size
    var._spec = TensorSpec((-(-math.prod(full) // shard_over),), var.dtype, full)
    var._replica_sharded = True
    var._shard_over = shard_over
    return var


def replica_sharded_buffer(
    shape: tuple[int, ...],
    dtype: DType,
    replica_grouping: ReplicaGrouping | None = None,
    shard_over: int | None = None,
    entries: int = 1,
) -> RemoteBuffer:
    """A remote buffer for replica-sharded tensors of full ``shape`` (including the group
    axis when the grouping has several groups), sharded over ``shard_over`` replicas
    (default: the group size).

    Raises:
        ValueError: ``shard_over`` larger than, or not dividing, the group size.
    """
    ir = context.get_current_graph().ir
    grouping = replica_grouping or ir.replica_grouping()
    group_size = grouping.group_size
    shard_over = group_size if shard_over is None else shard_over
    if shard_over > group_size or shard_over < 1 or group_size % shard_over:
        raise ValueError(
            f"shard_over={shard_over} must divide the group size {group_size} of {grouping} "
            "and be at most that size."
        )
    full = tuple(shape[1:]) if grouping.num_groups > 1 else tuple(shape)
    buffer = RemoteBuffer((-(-math.prod(full) // shard_over),), dtype, entries)
    buffer.meta_shape = full
    buffer._shard_over = shard_over
    return buffer


def replica_sharded_variable(
    data: HostScalarTensor,
    dtype: DType | None = None,
    name: str | None = None,
    downcast: bool = True,
    replica_grouping: ReplicaGrouping | None = None,
    shard_over: int | None = None,
    retrieval_mode: str | None = "one_per_group",
    log2_scale: int | None = None,
    nan_on_overflow: bool | None = None,
) -> tuple[Variable, Tensor]:
    """A replica-sharded variable and its on-device shard.

    Returns ``(var, shard)``: ``var`` is for the session's get/write (do not use it in ops);
    ``shard`` (``<name>_rts``, 1-D, meta-shape = full shape) behaves like an on-chip
    variable shard that the program may update in place. It is loaded from the variable
    by ``weights_from_host`` and written back by ``weights_to_host``.
    """
    from .ops import remote  # noqa: PLC0415

    # The buffer's dtype is the variable's: host data converted (and downcast) the same way.
    arr = _host_array(data, dtype, downcast, **_fp8_kwargs(log2_scale, nan_on_overflow))
    grouping = replica_grouping or context.get_current_graph().ir.replica_grouping()
    buffer = replica_sharded_buffer(
        arr.shape, dtype or _dtypes.dtype.as_dtype(arr.dtype), grouping, shard_over
    )
    var = remote_replica_sharded_variable(
        data,
        buffer,
        0,
        dtype,
        name,
        downcast,
        grouping,
        retrieval_mode,
        log2_scale,
        nan_on_overflow,
    )
    with context._execution_context("WeightsFromHostFragment"):
        shard = remote._load(buffer, 0, var.name, f"{var.name}_rts")
    with context._execution_context("WeightsToHostFragment"):
        remote.remote_store(buffer, 0, shard)
    return var, shard


__all__ = [
    "RemoteBuffer",
    "remote_buffer",
    "remote_variable",
    "remote_replica_sharded_variable",
    "replica_sharded_buffer",
    "replica_sharded_variable",
]
