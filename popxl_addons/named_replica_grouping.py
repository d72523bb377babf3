"""``NamedReplicaGrouping``: a DotTree of replica groupings, and grouping helpers.

Everything runs in one process here, so a grouping is never split across instances and an
IPU-Link domain holds at most 64 replicas, as on a Pod.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import popxl

from .dot_tree import DotTree

ILD_SIZE = 64


class NamedReplicaGrouping(DotTree[popxl.ReplicaGrouping]):
    """Replica groupings keyed like the variables they describe."""

    @classmethod
    def build_groups(
        cls, names: Iterable[str], value: popxl.ReplicaGrouping
    ) -> NamedReplicaGrouping:
        """Every name mapped to the same grouping."""
        names = list(names)
        return cls.pack(names, [value] * len(names))


def fill_none_group(rg: popxl.ReplicaGrouping | None, none_value: Any) -> Any:
    """``none_value`` when ``rg`` is None, else ``rg``."""
    return none_value if rg is None else rg


def get_instance_replica_grouping(rg: popxl.ReplicaGrouping | None = None) -> popxl.ReplicaGrouping:
    """The part of ``rg`` inside this process: all of it (there is one process)."""
    return rg or popxl.gir().replica_grouping()


def is_cross_instance(rg: popxl.ReplicaGrouping | None) -> bool:
    """Whether a grouping spans processes (never, with one process)."""
    return False


def get_ild_size_from_popdist() -> int:
    """Replicas per IPU-Link domain: ``min(replication_factor, 64)``."""
    return min(popxl.gir().replication_factor, ILD_SIZE)


def get_ild_replica_grouping(rg: popxl.ReplicaGrouping | None = None) -> popxl.ReplicaGrouping:
    """``rg`` restricted to one IPU-Link domain (unchanged when it fits in one)."""
    ir = popxl.gir()
    rg = rg or ir.replica_grouping()
    ild = get_ild_size_from_popdist()
    if rg.group_size * (rg.stride if rg.is_const else 1) <= ild:
        return rg
    return ir.replica_grouping(stride=rg.stride, group_size=max(1, ild // rg.stride))


def is_cross_ild(rg: popxl.ReplicaGrouping | None) -> bool:
    """Whether a grouping spans more than one IPU-Link domain."""
    return rg is not None and get_ild_replica_grouping(rg) != rg


__all__ = ["NamedReplicaGrouping", "fill_none_group"]
