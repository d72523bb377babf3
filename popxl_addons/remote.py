"""Remote buffers for named variables, and graphs that load/store them by entry index."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import popxl
from popxl import ops

from .dot_tree import DotTree, to_mapping
from .graph import GraphWithNamedArgs
from .named_tensors import NamedTensors
from .variable_factory import NamedVariableFactories


class NamedRemoteBuffers(DotTree[popxl.RemoteBuffer]):
    """Remote buffers keyed like the variables they hold."""


def create_remote_buffer(
    spec: popxl.TensorSpec | popxl.Tensor,
    entries: int = 1,
    replica_group: popxl.ReplicaGrouping | None = None,
    shard_over: int | None = None,
) -> popxl.RemoteBuffer:
    """A remote buffer for tensors like ``spec``, replica-sharded over ``shard_over``
    replicas when that is more than 1.

    Raises:
        ValueError: the tensor's size is not divisible by ``shard_over``.
    """
    if spec.meta_shape:
        buffer = popxl.remote_buffer(spec.shape, spec.dtype, entries)
        buffer.meta_shape = spec.meta_shape
        return buffer
    if shard_over is not None and shard_over > 1:
        group = replica_group or popxl.gcg().ir.replica_grouping()
        n = math.prod(spec.shape)
        if n % shard_over:
            raise ValueError(f"Can't shard tensor with {n} elements over {shard_over} replicas")
        shape = ((group.num_groups,) if group.num_groups > 1 else ()) + tuple(spec.shape)
        return popxl.replica_sharded_buffer(shape, spec.dtype, group, shard_over, entries)
    return popxl.remote_buffer(spec.shape, spec.dtype, entries)


def _shard_over(key: str, group_size: int, shard_over_dict: Mapping[str, int] | int | bool) -> int:
    if isinstance(shard_over_dict, bool):
        return group_size if shard_over_dict else 1
    if isinstance(shard_over_dict, int):
        if not 1 <= shard_over_dict <= group_size:
            raise ValueError(f"shard_over must be in [1, {group_size}], got {shard_over_dict}.")
        return shard_over_dict
    value = shard_over_dict.get(key)
    return group_size if value is None else value


def named_variable_buffers(
    factories: NamedVariableFactories,
    entries: int = 1,
    shard_over_dict: Mapping[str, int] | int | bool = True,
) -> NamedRemoteBuffers:
    """One buffer per factory. By default variables are sharded over their whole replica
    group (``shard_over_dict`` picks per key, for all, or disables sharding with False)."""
    buffers = {}
    for key, f in factories.to_dict().items():
        spec = popxl.TensorSpec(f.shape, f.dtype, f.meta_shape)
        shard_over = _shard_over(key, f.replica_grouping.group_size, shard_over_dict)
        if f.replica_sharded:
            # An already-sharded factory keeps its own shard count: a buffer built from its
            # shard spec would not know it, and its remote variable would be sharded over
            # the whole group instead.
            spec, shard_over = popxl.TensorSpec(f.meta_shape, f.dtype), f.shard_over
        buffers[key] = create_remote_buffer(spec, entries, f.replica_grouping, shard_over)
    return NamedRemoteBuffers.from_dict(buffers)


def named_buffers(tensors: NamedTensors, entries: int = 1) -> NamedRemoteBuffers:
    """One unsharded buffer per tensor, with the tensor's spec (and meta-shape)."""
    return NamedRemoteBuffers.from_dict(
        {k: create_remote_buffer(t.spec, entries) for k, t in tensors.to_dict().items()}
    )


def _grow(buffers: NamedRemoteBuffers, entries: int) -> tuple[list[str], list[popxl.RemoteBuffer]]:
    names, items = buffers.unpack()
    names, items = list(names), list(items)
    for b in items:
        b.entries = max(b.entries, entries)
    return names, items


def load_remote_graph(
    buffers: NamedRemoteBuffers, entries: int = 1, use_io_tiles: bool = False
) -> tuple[GraphWithNamedArgs, list[str]]:
    """A graph ``load_remote`` taking an int32 ``load_index`` and returning one tensor per
    buffer (sorted by key); the returned names pack the outputs back into NamedTensors."""
    names, items = _grow(buffers, entries)
    graph = popxl.gcg().ir.create_empty_graph("load_remote")
    with graph, _tiles(use_io_tiles):
        index = popxl.graph_input((), popxl.int32, "load_index")
        for b in items:
            popxl.graph_output(ops.remote_load(b, index))
    return GraphWithNamedArgs(graph), names


def store_remote_graph(
    buffers: NamedRemoteBuffers, entries: int = 1, use_io_tiles: bool = False
) -> GraphWithNamedArgs:
    """A graph ``store_remote`` taking ``store_index`` and one named input per buffer
    (sorted by key); bind the tensors to store and call it with the entry index."""
    names, items = _grow(buffers, entries)
    graph = popxl.gcg().ir.create_empty_graph("store_remote")
    args = {}
    with graph, _tiles(use_io_tiles):
        index = popxl.graph_input((), popxl.int32, "store_index")
        for name, b in zip(names, items):
            t = popxl.graph_input(b.tensor_shape, b.tensor_dtype, name, meta_shape=b.meta_shape)
            ops.remote_store(b, index, t)
            args[name] = t
    return GraphWithNamedArgs(graph, NamedTensors.from_dict(args))


def load_remote(
    buffers: NamedRemoteBuffers, entry: int | popxl.Tensor = 0, use_io_tiles: bool = False
) -> NamedTensors:
    """Load ``entry`` of every buffer in the current graph (not outlined)."""
    names, items = buffers.unpack() if buffers.len_flat() else ([], [])
    with _tiles(use_io_tiles):
        return NamedTensors.pack(list(names), [ops.remote_load(b, entry) for b in items])


def store_remote(
    buffers: NamedRemoteBuffers,
    tensors: NamedTensors,
    entry: int | popxl.Tensor = 0,
    use_io_tiles: bool = False,
) -> None:
    """Store each tensor into ``entry`` of the buffer with the same key."""
    with _tiles(use_io_tiles):
        for buffer, t in to_mapping(buffers, tensors).items():
            ops.remote_store(buffer, entry, t)


def _tiles(use_io_tiles: bool) -> Any:
    import contextlib  # noqa: PLC0415

    return popxl.io_tiles() if use_io_tiles else contextlib.nullcontext()


__all__ = [
    "NamedRemoteBuffers",
    "named_buffers",
    "named_variable_buffers",
    "create_remote_buffer",
    "load_remote_graph",
    "store_remote_graph",
    "load_remote",
    "store_remote",
]
