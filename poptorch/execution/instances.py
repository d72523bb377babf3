"""A PopTorch program run by several ``poprun`` instances.

Under ``poprun`` with more than one instance, every instance builds the same program as
one replicated program over all instances' replicas (``popxl.Ir(replication="popdist")``:
the runtime connects the instances with ``jax.distributed``): gradients are reduced over
every replica of every instance, so the weights are those of one process running the
global replica count. Each instance feeds and receives its own replicas' data, which its
``poptorch.DataLoader`` reads from its share of the dataset (``Options.Distributed``).
``popdist.poptorch.Options()`` sets all of this up; other options are checked against
what ``poprun`` decided.
"""

from __future__ import annotations

from typing import Any

import popdist

REPLICAS_MSG = (
    "This instance of a poprun run with {instances} instances runs {local} replicas "
    "(--num-replicas {total}), but poptorch.Options().replicationFactor is {got}. Use "
    "popdist.poptorch.Options(), which takes the replicas and the process layout from poprun."
)
PROCESS_MSG = (
    "poprun started this process as instance {index} of {instances}, but "
    "Options.Distributed says process {pid} of {num}. Use popdist.poptorch.Options(), or "
    "leave Options.Distributed as it reads the environment."
)


def runs_on_instances(options: Any) -> bool:
    """Whether the program spans several ``poprun`` instances.

    Raises:
        ValueError: the options' replication factor or process layout contradicts
            ``poprun``'s.
    """
    if not popdist.isPopdistEnvSet() or popdist.getNumInstances() == 1:
        return False
    popdist.check_layout()
    instances, local = popdist.getNumInstances(), popdist.getNumLocalReplicas()
    if options.replication_factor != local:
        raise ValueError(
            REPLICAS_MSG.format(
                instances=instances,
                local=local,
                total=popdist.getNumTotalReplicas(),
                got=options.replication_factor,
            )
        )
    dist = options.Distributed
    if (dist.processId, dist.numProcesses) != (popdist.getInstanceIndex(), instances):
        raise ValueError(
            PROCESS_MSG.format(
                index=popdist.getInstanceIndex(),
                instances=instances,
                pid=dist.processId,
                num=dist.numProcesses,
            )
        )
    return True


def global_replicas(options: Any) -> int:
    """The replicas the program runs on: every instance's under ``poprun``."""
    return (
        popdist.getNumTotalReplicas() if runs_on_instances(options) else options.replication_factor
    )
