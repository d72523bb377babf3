"""``popdist.popart``: PopART session options from the ``poprun`` environment."""

from __future__ import annotations

from typing import Any


def configureSessionOptions(opts: Any) -> None:  # noqa: N802 (PopDist's name)
    """Set the replication options of PopART ``SessionOptions`` for this instance.

    ``replicatedGraphCount`` is this instance's replicas, ``globalReplicationFactor`` and
    ``globalReplicaOffset`` place them among all instances' replicas, and
    ``enableDistributedReplicatedGraphs`` marks replication as spanning instances.
    """
    import popdist

    popdist.check_layout()
    local = popdist.getNumLocalReplicas()
    opts.enableReplicatedGraphs = local > 1
    opts.replicatedGraphCount = local
    opts.enableDistributedReplicatedGraphs = popdist.getNumInstances() > 1
    opts.globalReplicationFactor = popdist.getNumTotalReplicas()
    opts.globalReplicaOffset = popdist.getReplicaIndexOffset()


def getNumInstances() -> int:  # noqa: N802
    import popdist

    return popdist.getNumInstances()
