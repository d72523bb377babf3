"""PopDist: what an instance started by ``poprun`` knows about the whole run.

``poprun`` (``runtime/distributed/launcher.py``) starts every instance with ``POPDIST_*``
environment variables; these functions read them (``runtime/distributed/environment.py``),
with PopDist's meanings. Outside ``poprun`` they describe a single instance running one replica (``isPopdistEnvSet()`` is then ``False``).

Replicas are numbered globally: instance ``i`` runs the ``getNumLocalReplicas()``
consecutive replicas starting at ``getReplicaIndexOffset()``.

>>> import popdist
>>> popdist.getNumInstances(), popdist.getInstanceIndex()  # not under poprun
(1, 0)
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from runtime.distributed import environment as _env
from runtime.distributed.environment import (  # noqa: F401 (PopDist's constants)
    COORDINATOR_ADDRESS,
    ENV_VARS,
    INSTANCE_INDEX,
    NUM_INSTANCES,
    NUM_IPUS_PER_REPLICA,
    NUM_LOCAL_REPLICAS,
    NUM_TOTAL_REPLICAS,
    REPLICA_INDEX_OFFSET,
    TIMEOUT,
)

from . import popart as popart

# PopDist's names for what the runtime reads of poprun's environment.
isPopdistEnvSet = _env.is_set  # noqa: N816 (PopDist's names)
getNumInstances = _env.num_instances  # noqa: N816
getInstanceIndex = _env.instance_index  # noqa: N816
getNumTotalReplicas = _env.num_total_replicas  # noqa: N816
getNumLocalReplicas = _env.num_local_replicas  # noqa: N816
getReplicaIndexOffset = _env.replica_index_offset  # noqa: N816
getNumIpusPerReplica = _env.num_ipus_per_replica  # noqa: N816
check_layout = _env.check_layout
# Not in PopDist, which used MPI instead.
getCoordinatorAddress = _env.coordinator_address  # noqa: N816


def init() -> None:
    """Connect this instance to the others now (``jax.distributed``), as PopDist's ``init``.

    ``popxl.Session`` does this by itself for ``Ir(replication="popdist")``; call it early
    when the program uses JAX before creating a session. A no-op with one instance.
    """
    from runtime.distributed import instances  # noqa: PLC0415 (lazy: jax only when joining)

    instances.initialize()


def execute_on_instances(instances: Collection[int], fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn(*args)`` only on the listed instances (e.g. ``{0}`` to save a checkpoint
    once); returns its result there and ``None`` elsewhere."""
    if getInstanceIndex() in instances:
        return fn(*args)
    return None
