"""PopDist: what an instance started by ``poprun`` knows about the whole run.

``poprun`` (``runtime/launcher.py``) starts every instance with ``POPDIST_*`` environment
variables; these functions read them, with PopDist's meanings. Outside ``poprun`` they
describe a single instance running one replica (``isPopdistEnvSet()`` is then ``False``).

Replicas are numbered globally: instance ``i`` runs the ``getNumLocalReplicas()``
consecutive replicas starting at ``getReplicaIndexOffset()``.

>>> import popdist
>>> popdist.getNumInstances(), popdist.getInstanceIndex()  # not under poprun
(1, 0)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from typing import Any

from . import popart as popart

NUM_INSTANCES = "POPDIST_NUM_INSTANCES"
INSTANCE_INDEX = "POPDIST_INSTANCE_INDEX"
NUM_TOTAL_REPLICAS = "POPDIST_NUM_TOTAL_REPLICAS"
NUM_LOCAL_REPLICAS = "POPDIST_NUM_LOCAL_REPLICAS"
REPLICA_INDEX_OFFSET = "POPDIST_REPLICA_INDEX_OFFSET"
NUM_IPUS_PER_REPLICA = "POPDIST_NUM_IPUS_PER_REPLICA"
COORDINATOR_ADDRESS = "POPDIST_COORDINATOR_ADDRESS"
TIMEOUT = "POPDIST_TIMEOUT"
# Every variable poprun sets (the coordinator and timeout only when there are several instances).
ENV_VARS = (
    NUM_INSTANCES,
    INSTANCE_INDEX,
    NUM_TOTAL_REPLICAS,
    NUM_LOCAL_REPLICAS,
    REPLICA_INDEX_OFFSET,
    NUM_IPUS_PER_REPLICA,
)
BAD_VALUE_MSG = (
    "The environment variable {name}={value!r} set for this instance is not a {what}. "
    "Start instances with `poprun`, which sets every POPDIST_* variable."
)


def _int_env(name: str, default: int, minimum: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        what = "positive integer" if minimum > 0 else "non-negative integer"
        raise ValueError(BAD_VALUE_MSG.format(name=name, value=raw, what=what))
    return value


def isPopdistEnvSet() -> bool:  # noqa: N802 (PopDist's name)
    """Whether this process was started by ``poprun``."""
    return all(name in os.environ for name in ENV_VARS)


def getNumInstances() -> int:  # noqa: N802
    """How many instances (processes) the run has."""
    return _int_env(NUM_INSTANCES, 1, 1)


def getInstanceIndex() -> int:  # noqa: N802
    """This instance's index, ``0 <= index < getNumInstances()``."""
    return _int_env(INSTANCE_INDEX, 0, 0)


def getNumTotalReplicas() -> int:  # noqa: N802
    """Replicas over all instances (the global replication factor)."""
    return _int_env(NUM_TOTAL_REPLICAS, getNumLocalReplicas() * getNumInstances(), 1)


def getNumLocalReplicas() -> int:  # noqa: N802
    """Replicas this instance runs."""
    return _int_env(NUM_LOCAL_REPLICAS, 1, 1)


def getReplicaIndexOffset() -> int:  # noqa: N802
    """The global index of this instance's first replica."""
    return _int_env(REPLICA_INDEX_OFFSET, getInstanceIndex() * getNumLocalReplicas(), 0)


def getNumIpusPerReplica() -> int:  # noqa: N802
    """IPUs per replica, as given to ``poprun --ipus-per-replica``."""
    return _int_env(NUM_IPUS_PER_REPLICA, 1, 1)


def getCoordinatorAddress() -> str | None:  # noqa: N802
    """``host:port`` of JAX's distributed coordinator (instance 0), when there are several
    instances. Not in PopDist, which used MPI instead."""
    return os.environ.get(COORDINATOR_ADDRESS)


def init() -> None:
    """Connect this instance to the others now (``jax.distributed``), as PopDist's ``init``.

    ``popxl.Session`` does this by itself for ``Ir(replication="popdist")``; call it early
    when the program uses JAX before creating a session. A no-op with one instance.
    """
    from runtime import distributed

    distributed.initialize()


def execute_on_instances(instances: Collection[int], fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn(*args)`` only on the listed instances (e.g. ``{0}`` to save a checkpoint
    once); returns its result there and ``None`` elsewhere."""
    if getInstanceIndex() in instances:
        return fn(*args)
    return None


def check_layout() -> None:
    """Raise a clear error when the POPDIST_* variables contradict each other."""
    total, local = getNumTotalReplicas(), getNumLocalReplicas()
    instances, index = getNumInstances(), getInstanceIndex()
    if index >= instances:
        raise ValueError(
            f"{INSTANCE_INDEX}={index} is not below {NUM_INSTANCES}={instances}. "
            "Start instances with `poprun`."
        )
    if local * instances != total:
        raise ValueError(
            f"{NUM_TOTAL_REPLICAS}={total} is not {NUM_LOCAL_REPLICAS}={local} times "
            f"{NUM_INSTANCES}={instances}. Start instances with `poprun`."
        )
