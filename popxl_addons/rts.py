"""Replicated tensor sharding helpers: shard specs, gathering shards, reducing to shards."""

from __future__ import annotations

import math
from typing import Any

import popxl
from popxl.ops import collectives
from popxl.ops.collectives import CollectiveOps

from .graph import GraphWithNamedArgs
from .named_replica_grouping import NamedReplicaGrouping
from .named_tensors import NamedTensors


def replica_sharded_spec(
    t: popxl.Tensor | popxl.TensorSpec, shard_over: popxl.ReplicaGrouping
) -> popxl.TensorSpec:
    """The spec of ``t``'s shard over ``shard_over``'s groups: ``(nelms / group_size,)`` with
    ``meta_shape = t.shape``. Unchanged when ``t`` is already sharded, the group has one
    replica, or the size does not divide evenly."""
    size = shard_over.group_size
    n = math.prod(t.shape)
    if t.meta_shape or size == 1 or n % size:
        return popxl.TensorSpec(t.shape, t.dtype, t.meta_shape)
    return popxl.TensorSpec((n // size,), t.dtype, t.shape)


def gather_replica_sharded_tensor(
    t: popxl.Tensor, use_io_tiles: bool = False, replica_group: popxl.ReplicaGrouping | None = None
) -> popxl.Tensor:
    """The full tensor of a shard (all-gather in ``replica_group``); ``t`` itself if not sharded."""
    if not t.meta_shape:
        return t
    if use_io_tiles:
        with popxl.io_tiles():
            gathered = collectives.replicated_all_gather(t, group=replica_group)
        return popxl.ops.io_tile_copy(gathered)
    return collectives.replicated_all_gather(t, group=replica_group)


def all_gather_replica_sharded_graph(
    tensors: NamedTensors,
    use_io_tiles: bool = False,
    replica_groups: NamedReplicaGrouping | None = None,
) -> tuple[GraphWithNamedArgs, list[str]]:
    """A graph ``all_gather`` with one named input per tensor (sorted by key) and the gathered
    tensors as outputs in the same order."""
    names, items = tensors.unpack() if tensors.len_flat() else ([], [])
    names = list(names)
    groups = replica_groups.to_dict() if replica_groups is not None else {}
    graph = popxl.gcg().ir.create_empty_graph("all_gather")
    args = {}
    with graph:
        for name, t in zip(names, items):
            x = popxl.graph_input(t.shape, t.dtype, name, meta_shape=t.meta_shape)
            args[name] = x
            group = groups.get(name)
            popxl.graph_output(
                gather_replica_sharded_tensor(x, use_io_tiles, group.const_rg if group else None)
            )
    return GraphWithNamedArgs(graph, NamedTensors.from_dict(args)), names


def reduce_replica_sharded_tensor(
    t: popxl.Tensor,
    op: CollectiveOps = "add",
    replica_group: popxl.ReplicaGrouping | None = None,
    shard_group: popxl.ReplicaGrouping | None = None,
) -> popxl.Tensor:
    """Reduce ``t`` over ``replica_group`` and shard it over ``shard_group`` (default: the
    same group): a reduce-scatter when both are equal, else an all-reduce then a slice. A
    tensor that cannot be sharded evenly is all-reduced."""
    ir = popxl.gcg().ir
    replica_group = replica_group or ir.replica_grouping()
    shard_group = shard_group or replica_group
    size = shard_group.group_size
    if size > 1 and t.nelms % size == 0:
        if shard_group == replica_group:
            return collectives.replicated_reduce_scatter(t, op, replica_group, True)
        reduced = collectives.replicated_all_reduce(t, op, replica_group)
        return collectives.replica_sharded_slice(reduced, shard_group)
    return collectives.replicated_all_reduce(t, op, replica_group)


def reduce_replica_sharded_graph(
    tensors: NamedTensors,
    op: CollectiveOps = "add",
    use_io_tiles: bool = False,
    shard_groups: NamedReplicaGrouping | None = None,
    replica_group: popxl.ReplicaGrouping | None = None,
) -> tuple[GraphWithNamedArgs, list[str]]:
    """A graph ``replica_reduce`` applying ``reduce_replica_sharded_tensor`` to each tensor
    (sorted by key); per-key shard groups come from ``shard_groups``."""
    names, items = tensors.unpack() if tensors.len_flat() else ([], [])
    names = list(names)
    groups = shard_groups.to_dict() if shard_groups is not None else {}
    graph = popxl.gcg().ir.create_empty_graph("replica_reduce")
    args = {}
    with graph, _tiles(use_io_tiles):
        for name, t in zip(names, items):
            x = popxl.graph_input(t.shape, t.dtype, name, meta_shape=t.meta_shape)
            args[name] = x
            popxl.graph_output(
                reduce_replica_sharded_tensor(x, op, replica_group, groups.get(name, replica_group))
            )
    return GraphWithNamedArgs(graph, NamedTensors.from_dict(args)), names


def _tiles(use_io_tiles: bool) -> Any:
    import contextlib  # noqa: PLC0415

    return popxl.io_tiles() if use_io_tiles else contextlib.nullcontext()


__all__ = [
    "replica_sharded_spec",
    "gather_replica_sharded_tensor",
    "all_gather_replica_sharded_graph",
    "reduce_replica_sharded_tensor",
    "reduce_replica_sharded_graph",
]
