"""``ReplicatedReduceScatterStrided``: reduce over a strided group, keep one chunk each."""

from __future__ import annotations

import math
from typing import Any

from popxl import ReplicaGrouping, Tensor
from popxl.ops.collectives import CollectiveOps
from popxl.tensor_spec import TensorSpec

from .._native import (
    check_reduction,
    group_size,
    groups_of,
    record,
    reduce_scatter_flat,
    replica_op,
)


def _scatter_infer(t: Any, *, groups: Any, rts: bool, **_: Any) -> list:
    size = group_size(groups)
    return [TensorSpec((-(-math.prod(t.shape) // size),), t.dtype, t.shape if rts else ())]


def _lower_scatter(x: Any, *, op: str, groups: Any, rts: bool, impl: str) -> Any:
    return reduce_scatter_flat(x, op, groups, impl)


REDUCE_SCATTER_STRIDED = replica_op(
    "replicated_reduce_scatter_strided",
    "ReplicatedReduceScatterStrided",
    _scatter_infer,
    _lower_scatter,
    grad="none",
)


def replicated_reduce_scatter_strided(
    t: Tensor,
    op: CollectiveOps = "add",
    group: ReplicaGrouping | None = None,
    configure_output_for_replicated_tensor_sharding: bool = False,
) -> Tensor:
    """Reduce ``t`` over each group and give the replica of rank ``r`` the r-th chunk.

    ``t`` is flattened and zero-padded to a multiple of the group size; the result is 1-D
    of ``ceil(t.nelms / group_size)`` elements, replica-sharded (``meta_shape = t.shape``)
    with ``configure_output_for_replicated_tensor_sharding``. As in the original the op has
    no gradient.

    Args:
        t: the per-replica tensor.
        op: ``"add"`` or ``"mean"``.
        group: the replica grouping (stride and group size; default: all replicas).
        configure_output_for_replicated_tensor_sharding: make the result an RTS shard.

    Raises:
        popxl.errors.PopXLException: ``op`` is neither ``"add"`` nor ``"mean"``.
    """
    check_reduction(REDUCE_SCATTER_STRIDED, op, ("add", "mean"))
    attrs = {
        "op": op,
        "groups": groups_of(group),
        "rts": bool(configure_output_for_replicated_tensor_sharding),
    }
    return record(REDUCE_SCATTER_STRIDED, {"t": t}, attrs, ["replicated_reduce_scatter_strided_out"])[0]


__all__ = ["replicated_reduce_scatter_strided"]
