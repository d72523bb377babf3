"""What ``poprun`` tells each instance: the ``POPDIST_*`` environment variables.

``launcher`` sets them when it starts the instances; ``instances`` and ``popdist`` read them
here. Outside ``poprun`` they describe a single instance running one replica.
Replicas are numbered globally: instance ``i`` runs ``num_local_replicas()`` consecutive
replicas starting at ``replica_index_offset()``.
"""

from __future__ import annotations

import os

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


def is_set() -> bool:
    """Whether this process was started by ``poprun``."""
    return all(name in os.environ for name in ENV_VARS)


def num_instances() -> int:
    """How many instances (processes) the run has."""
    return _int_env(NUM_INSTANCES, 1, 1)


def instance_index() -> int:
    """This instance's index, ``0 <= index < num_instances()``."""
    return _int_env(INSTANCE_INDEX, 0, 0)


def num_total_replicas() -> int:
    """Replicas over all instances (the global replication factor)."""
    return _int_env(NUM_TOTAL_REPLICAS, num_local_replicas() * num_instances(), 1)


def num_local_replicas() -> int:
    """Replicas this instance runs."""
    return _int_env(NUM_LOCAL_REPLICAS, 1, 1)


def replica_index_offset() -> int:
    """The global index of this instance's first replica."""
    return _int_env(REPLICA_INDEX_OFFSET, instance_index() * num_local_replicas(), 0)


def num_ipus_per_replica() -> int:
    """IPUs per replica, as given to ``poprun --ipus-per-replica``."""
    return _int_env(NUM_IPUS_PER_REPLICA, 1, 1)


def coordinator_address() -> str | None:
    """``host:port`` of JAX's distributed coordinator (instance 0), when there are several
    instances."""
    return os.environ.get(COORDINATOR_ADDRESS)


def check_layout() -> None:
    """Raise a clear error when the POPDIST_* variables contradict each other."""
    total, local = num_total_replicas(), num_local_replicas()
    instances, index = num_instances(), instance_index()
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
