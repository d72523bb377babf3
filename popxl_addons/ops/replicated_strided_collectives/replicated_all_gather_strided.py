"""``ReplicatedAllGatherStrided``: gather a tensor from the replicas of a strided group."""

from __future__ import annotations

import math
from typing import Any

from popxl import ReplicaGrouping, Tensor
from popxl.tensor_spec import TensorSpec

from .._native import all_gather_flat, group_size, groups_of, record, replica_op

GATHER_META_MSG = (
    "replicated_all_gather_strided: {t} has meta-shape {meta} ({n} elements), but the group "
    "of {size} replicas gathers {gathered} elements. Shard it over the same group size, "
    "without padding."
)


def _gather_infer(t: Any, *, groups: Any, **_: Any) -> list:
    return [TensorSpec((group_size(groups) * math.prod(t.shape),), t.dtype)]


def _lower_gather(x: Any, *, groups: Any, impl: str) -> Any:
    return all_gather_flat(x, groups)


ALL_GATHER_STRIDED = replica_op(
    "replicated_all_gather_strided",
    "ReplicatedAllGatherStrided",
    _gather_infer,
    _lower_gather,
    grad="none",
)


def replicated_all_gather_strided(t: Tensor, group: ReplicaGrouping | None = None) -> Tensor:
    """Gather ``t`` (flattened) from the replicas of each group, in rank order.

    The result is 1-D of ``group_size * t.nelms`` elements; for a replica-sharded ``t``
    (one with a meta-shape) it is reshaped to ``t.meta_shape``. As in the original the op
    has no gradient.

    Args:
        t: the per-replica tensor (or shard).
        group: the replica grouping (stride and group size; default: all replicas).

    Raises:
        ValueError: ``t`` has a meta-shape whose size differs from the gathered size.
    """
    groups = groups_of(group)
    out = record(
        ALL_GATHER_STRIDED, {"t": t}, {"groups": groups}, ["replicated_all_gather_strided_out"]
    )[0]
    if t.meta_shape:
        if math.prod(t.meta_shape) != out.shape[0]:
            raise ValueError(
                GATHER_META_MSG.format(
                    t=t.id,
                    meta=t.meta_shape,
                    n=math.prod(t.meta_shape),
                    size=group_size(groups),
                    gathered=out.shape[0],
                )
            )
        out = out.reshape_(t.meta_shape)
    return out


__all__ = ["replicated_all_gather_strided"]
