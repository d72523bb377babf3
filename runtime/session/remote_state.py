"""Host ↔ device layout of variables that live in remote buffers.

A remote buffer's device state is ``(entries, *tensor_shape)`` per replica (with a leading
replica axis when replicated). A remote variable occupies one slot. Its host value is laid
out like any variable's (``(num_groups, *shape)`` when grouped). A replica-sharded variable's
slot holds one flat shard: replica ``r`` of a group gets chunk ``rank(r) % shard_over`` of
its group's value, flattened and zero-padded to ``shard_over`` equal chunks. PopXL also
accepts a replica-sharded variable in a buffer whose slots are larger than a shard (e.g. a
``RemoteBuffer`` of the full shape): the shard then fills the start of the flattened slot
and the rest is zero.
"""

from __future__ import annotations

import math

import numpy as np

from popxl.tensor import Variable

SLOT_MISMATCH_MSG = (
    "Remote variable {tid} is {dtype}{shape} on each replica, but its slot {offset} of remote "
    "buffer {bid} holds {bdtype}{bshape}. The variable's value must fill its slot exactly "
    "(the same dtype and number of elements; the shapes may differ): create the buffer with popxl.remote_buffer({shape}, popxl.{dtype}), or, if the leading "
    "axis of the data was meant to hold one value per replica group, use a replica grouping "
    "with that many groups (the variable's grouping, {grouping}, has {groups})."
)


def check_slot_shapes(variables: list[Variable]) -> None:
    """Every (unsharded) remote variable fills its buffer's slot: same dtype and size.

    PopXL did not check this; PopART copied the slot's byte size from the start of the
    variable's data (and back). With as many elements as the slot that is a row-major
    reshape, which is what happens here (a ``(1, 1)`` variable in a ``(1,)`` buffer, as
    upstream's test_replica_grouping does); otherwise a larger variable was cut short
    silently and a smaller one read past its end, so that is an error here.

    Raises:
        ValueError: a variable whose dtype or number of elements differs from its slot's.
    """
    for var in variables:
        buffer = var._remote_buffer
        if buffer is None or var._replica_sharded:
            continue
        same_size = math.prod(var.shape) == math.prod(buffer.tensor_shape)
        if not same_size or var.dtype is not buffer.tensor_dtype:
            grouping = var.replica_grouping
            raise ValueError(
                SLOT_MISMATCH_MSG.format(
                    tid=var.id,
                    dtype=var.dtype.name,
                    shape=var.shape,
                    offset=var._remote_offset,
                    bid=buffer.remote_buffer_id,
                    bdtype=buffer.tensor_dtype.name,
                    bshape=buffer.tensor_shape,
                    grouping=grouping,
                    groups=f"{grouping.num_groups} group" + "s" * (grouping.num_groups != 1),
                )
            )


def _group_value(var: Variable, host: np.ndarray, replica: int, per_replica: bool) -> np.ndarray:
    grouping = var.replica_grouping
    if per_replica:
        return host[replica]
    return host[grouping.assignment[replica]] if grouping.num_groups > 1 else host


def _shard(var: Variable, full: np.ndarray, replica: int) -> np.ndarray:
    members = next(m for m in var.replica_grouping.members if replica in m)
    index = members.index(replica) % var._shard_over
    chunk = var.shape[0]
    flat = np.zeros(chunk * var._shard_over, full.dtype)
    flat[: full.size] = full.reshape(-1)
    return flat[index * chunk : (index + 1) * chunk]


def slot_value(var: Variable, host: np.ndarray, replica: int, per_replica: bool) -> np.ndarray:
    """What replica ``replica``'s slot holds for host value ``host``."""
    full = _group_value(var, host, replica, per_replica)
    return _shard(var, full, replica) if var._replica_sharded else full


def _fill_slot(
    buffer: np.ndarray, index: tuple[int, ...], value: np.ndarray, sharded: bool
) -> None:
    slot_shape = buffer.shape[len(index) :]
    if sharded and value.size != math.prod(slot_shape):
        flat = np.zeros(math.prod(slot_shape), buffer.dtype)
        flat[: value.size] = value.reshape(-1)
        value = flat
    buffer[index] = value.reshape(slot_shape)  # same size: see check_slot_shapes


def write_slots(
    buffer: np.ndarray, var: Variable, host: np.ndarray, replicas: int, per_replica: bool
) -> None:
    """Write ``var``'s host value into its slot of every replica's copy of ``buffer``."""
    offset, sharded = var._remote_offset, var._replica_sharded
    if replicas == 1:
        _fill_slot(buffer, (offset,), slot_value(var, host, 0, per_replica), sharded)
        return
    for r in range(replicas):
        _fill_slot(buffer, (r, offset), slot_value(var, host, r, per_replica), sharded)


def _full_from_shards(var: Variable, buffer: np.ndarray, members: list[int]) -> np.ndarray:
    chunk = var.shape[0]
    shards = [buffer[m, var._remote_offset].reshape(-1)[:chunk] for m in members[: var._shard_over]]
    full_shape = var.meta_shape
    return np.concatenate(shards)[: math.prod(full_shape)].reshape(full_shape)


def _replica_value(var: Variable, buffer: np.ndarray, replica: int) -> np.ndarray:
    if not var._replica_sharded:
        return buffer[replica, var._remote_offset].reshape(var.shape)
    members = next(m for m in var.replica_grouping.members if replica in m)
    return _full_from_shards(var, buffer, members)


def read_slots(buffer: np.ndarray, var: Variable, replicas: int, per_replica: bool) -> np.ndarray:
    """``var``'s host value from the device contents of its buffer."""
    if replicas == 1:
        if var._replica_sharded:
            return _full_from_shards(var, buffer[None], [0])
        return np.array(buffer[var._remote_offset].reshape(var.shape))
    if per_replica:
        return np.stack([_replica_value(var, buffer, r) for r in range(replicas)])
    groups = var.replica_grouping.members
    values = [_replica_value(var, buffer, members[0]) for members in groups]
    return np.stack(values) if len(groups) > 1 else np.array(values[0])
