"""``ReplicatedAllReduceStrided``: the all-reduce pairs over strided replica groups.

Same semantics as ``replicated_all_reduce_TP`` (flags ``identical_inputs`` /
``identical_grad_inputs``, swapped in the gradient), with ``add`` or ``mean``.
"""

from __future__ import annotations

import popxl
from popxl import ReplicaGrouping, Tensor, ops
from popxl.ops.collectives import CollectiveOps

from ...graph import GraphWithNamedArgs
from ...named_tensors import NamedTensors
from .._native import define_all_reduce_pair, record_all_reduce_pair

ALL_REDUCE_STRIDED = define_all_reduce_pair(
    "replicated_all_reduce_strided", "ReplicatedAllReduceStrided", "replicated_all_reduce_strided"
)
_ADD_OR_MEAN = ("add", "mean")


def _all_reduce_strided(
    t: Tensor, op: str, group: ReplicaGrouping | None, inputs: bool, grad_inputs: bool
) -> Tensor:
    return record_all_reduce_pair(
        ALL_REDUCE_STRIDED,
        t,
        op,
        group,
        _ADD_OR_MEAN,
        inputs,
        grad_inputs,
        "replicated_all_reduce_strided_out",
    )


def replicated_all_reduce_strided(
    t: Tensor, op: CollectiveOps = "add", group: ReplicaGrouping | None = None
) -> Tensor:
    """All-reduce over each (strided) group; the gradient is an all-reduce too.

    Args:
        t: the per-replica tensor.
        op: ``"add"`` or ``"mean"``.
        group: the replica grouping (stride and group size; default: all replicas).

    Raises:
        popxl.errors.PopXLException: ``op`` is neither ``"add"`` nor ``"mean"``.
    """
    return _all_reduce_strided(t, op, group, False, False)


def replicated_all_reduce_strided_identical_inputs(
    t: Tensor, op: CollectiveOps = "add", group: ReplicaGrouping | None = None
) -> Tensor:
    """Forward identity (inputs equal within each group), gradient all-reduce."""
    return _all_reduce_strided(t, op, group, True, False)


def replicated_all_reduce_strided_identical_grad_inputs(
    t: Tensor, op: CollectiveOps = "add", group: ReplicaGrouping | None = None
) -> Tensor:
    """Forward all-reduce, gradient identity (incoming gradients equal within each group)."""
    return _all_reduce_strided(t, op, group, False, True)


def replicated_all_reduce_strided_graph(
    tensors: NamedTensors,
    op: CollectiveOps = "add",
    group: ReplicaGrouping | None = None,
    use_io_tiles: bool = False,
) -> tuple[GraphWithNamedArgs, list[str]]:
    """A graph with one named input per tensor of ``tensors`` that all-reduces each.

    Returns the graph and the names of its outputs, in order:
    ``NamedTensors.pack(names, graph.bind(ts).call())``. With ``use_io_tiles`` each input
    is first copied to the IO tiles. (Fixes the original, which passed ``group`` and
    ``op`` to the all-reduce in the wrong order.)
    """
    ir = popxl.gcg().ir
    graph = ir.create_empty_graph("replica_reduce")
    names: list[str] = []
    args = {}
    with graph, popxl.in_sequence(False):
        for name, tensor in zip(*tensors.unpack()):
            sg_t = popxl.graph_input(
                tensor.shape, tensor.dtype, tensor.name, meta_shape=tensor.meta_shape
            )
            args[name] = sg_t
            names.append(name)
            if use_io_tiles:
                with popxl.io_tiles():
                    sg_t = ops.io_tile_copy(sg_t)
            popxl.graph_output(replicated_all_reduce_strided(sg_t, op, group))
    return GraphWithNamedArgs(graph, NamedTensors.from_dict(args)), names


__all__ = [
    "replicated_all_reduce_strided",
    "replicated_all_reduce_strided_identical_inputs",
    "replicated_all_reduce_strided_identical_grad_inputs",
    "replicated_all_reduce_strided_graph",
]
