"""Where the program keeps weights, optimiser state and accumulators (TensorLocations).

Each variable is stored in one of four ways, chosen from its class's
``TensorLocationSettings`` and its size:

================  ==============  ======================================================
on chip           sharded (RTS)   variable
================  ==============  ======================================================
yes               no              ``popxl.variable``
no                no              ``popxl.remote_variable``: ``remote_load`` where used,
                                  ``remote_store`` after an update
yes               yes             ``popxl.replica_sharded_variable``: each replica keeps
                                  one flat shard on chip
no                yes             ``popxl.remote_replica_sharded_variable``: each replica's
                                  remote slot holds its shard
================  ==============  ======================================================

A tensor goes off chip when ``useOnChipStorage(False)`` and it has at least
``minElementsForOffChip`` elements; it is sharded when ``useReplicatedTensorSharding(True)``,
it has at least ``minElementsForReplicatedTensorSharding`` elements, its replica group has
more than one replica and the group size divides its element count (so shards need no
padding). A sharded tensor is used whole through ``replicated_all_gather``; the
optimiser updates shards (see ``_program``). ``useIOTilesToLoad`` / ``useIOTilesToStore``
run the remote loads / stores on the IO tiles (``popxl.io_tiles()`` plus an
``io_tile_copy``).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

import popxl
from popxl import ops
from popxl.errors import InternalError
from popxl.ops import collectives
from popxl.tensor import variable_sharing_memory

from ..options.core import TensorLocationSettings


@dataclass
class _Stored:
    """How one variable is kept (variables not listed are plain on-chip variables)."""

    buffer: popxl.RemoteBuffer | None = None  # off chip
    shard: popxl.Tensor | None = None  # on-chip RTS shard
    group: popxl.ReplicaGrouping | None = None  # sharded over this group
    io_load: bool = False
    io_store: bool = False


_STORED: weakref.WeakKeyDictionary[popxl.Variable, _Stored] = weakref.WeakKeyDictionary()


def is_off_chip(settings: TensorLocationSettings, shape: tuple[int, ...]) -> bool:
    """Whether a tensor of ``shape`` goes to streaming memory under ``settings``."""
    return settings.on_chip is False and math.prod(shape) >= settings.min_elements_off_chip


def is_sharded(
    settings: TensorLocationSettings, shape: tuple[int, ...], grouping: popxl.ReplicaGrouping
) -> bool:
    """Whether a tensor of ``shape`` (one value per group of ``grouping``) is sharded."""
    n, size = math.prod(shape), grouping.group_size
    return (
        settings.replicated_tensor_sharding
        and size > 1
        and n >= max(settings.min_elements_rts, 1)
        and n % size == 0
    )


def place(
    data: np.ndarray,
    dtype: popxl.dtype,
    name: str,
    grouping: popxl.ReplicaGrouping,
    settings: TensorLocationSettings,
) -> popxl.Variable:
    """A variable holding ``data`` (one value per replica group), placed as ``settings``
    say."""
    shape = data.shape[1:] if grouping.num_groups > 1 else data.shape
    off, sharded = is_off_chip(settings, shape), is_sharded(settings, shape, grouping)
    io_load, io_store = settings.io_tiles_to_load, settings.io_tiles_to_store
    if sharded and off:
        buffer = popxl.replica_sharded_buffer(data.shape, dtype, grouping)
        var = popxl.remote_replica_sharded_variable(
            data, buffer, 0, dtype, name, replica_grouping=grouping
        )
        _STORED[var] = _Stored(buffer=buffer, group=grouping, io_load=io_load, io_store=io_store)
    elif sharded:
        var, shard = popxl.replica_sharded_variable(data, dtype, name, replica_grouping=grouping)
        _STORED[var] = _Stored(shard=shard, group=grouping, io_load=io_load, io_store=io_store)
    elif off:
        buffer = popxl.remote_buffer(shape, dtype, 1)
        var = popxl.remote_variable(data, buffer, 0, dtype, name, replica_grouping=grouping)
        _STORED[var] = _Stored(buffer=buffer, io_load=io_load, io_store=io_store)
    elif isinstance(data, np.ndarray) and data.dtype == dtype.as_numpy():
        # The factories hand over the torch model's parameters (or arrays made for the
        # program): the variable reads them rather than keep a second copy of every weight.
        var = variable_sharing_memory(data, dtype, name, replica_grouping=grouping)
    else:
        var = popxl.variable(data, dtype, name, replica_grouping=grouping)
    return var


def shard_group(var: popxl.Variable) -> popxl.ReplicaGrouping | None:
    """The group ``var`` is sharded over, or None if each replica holds it whole."""
    stored = _STORED.get(var)
    return stored.group if stored is not None else None


def full_shape(var: popxl.Variable) -> tuple[int, ...]:
    """The whole tensor's shape (a sharded variable's own shape is its shard's)."""
    return tuple(var.meta_shape) if shard_group(var) is not None else tuple(var.shape)


def is_remote(var: popxl.Variable) -> bool:
    stored = _STORED.get(var)
    return stored is not None and stored.buffer is not None


def read_stored(var: popxl.Variable) -> popxl.Tensor:
    """``var``'s value as stored: the whole tensor, or this replica's shard (loaded from
    streaming memory if it lives there)."""
    stored = _STORED.get(var)
    if stored is None:
        return var
    if stored.shard is not None:
        return stored.shard
    if stored.buffer is None:
        raise InternalError(
            f"{var.id} is stored off chip but has no remote buffer", graph=var.graph
        )
    if not stored.io_load:
        return ops.remote_load(stored.buffer, 0, f"{var.name}_loaded")
    with popxl.io_tiles():
        loaded = ops.remote_load(stored.buffer, 0, f"{var.name}_loaded")
    return ops.io_tile_copy(loaded)


def read(var: popxl.Variable) -> popxl.Tensor:
    """``var``'s whole value (its shards gathered over the replica group)."""
    value = read_stored(var)
    stored = _STORED.get(var)
    if stored is None or stored.group is None:
        return value
    whole = collectives.replicated_all_gather(value, group=stored.group, output_shape="concat")
    return ops.reshape(whole, full_shape(var))


def write_stored(var: popxl.Variable, loaded: popxl.Tensor, value: popxl.Tensor) -> None:
    """Set ``var`` (read as ``loaded`` by ``read_stored``) to ``value``, in stored form."""
    stored = _STORED.get(var)
    if value.dtype != var.dtype:
        value = ops.cast(value, var.dtype)
    if stored is None or stored.shard is not None:
        ops.var_updates.copy_var_update_(loaded, value)
        return
    _store(var, value)


def write(var: popxl.Variable, loaded: popxl.Tensor, value: popxl.Tensor) -> None:
    """Set ``var`` (read as ``loaded`` by ``read``) to the whole ``value``."""
    stored = _STORED.get(var)
    if stored is None:
        write_stored(var, loaded, value)
        return
    if stored.group is not None:
        value = collectives.replica_sharded_slice(value, stored.group)
    write_stored(var, read_stored(var) if stored.shard is not None else loaded, value)


def flush(var: popxl.Variable, loaded: popxl.Tensor) -> None:
    """Store ``loaded`` (read by ``read_stored`` and updated in place) back to streaming
    memory if ``var`` lives there."""
    if is_remote(var):
        _store(var, loaded)


def _store(var: popxl.Variable, value: popxl.Tensor) -> None:
    stored = _STORED[var]
    if stored.buffer is None:
        raise InternalError(
            f"{var.id} is stored off chip but has no remote buffer", graph=var.graph
        )
    if stored.io_store:
        with popxl.io_tiles():
            ops.remote_store(stored.buffer, 0, ops.io_tile_copy(value))
    else:
        ops.remote_store(stored.buffer, 0, value)
