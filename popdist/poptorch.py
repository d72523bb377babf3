"""``popdist.poptorch``: ``poptorch.Options`` set up for one ``poprun`` instance.

``Options(ipus_per_replica)`` replicates the model over this instance's replicas
(``getNumLocalReplicas``) and makes it process ``getInstanceIndex()`` of
``getNumInstances()`` (``Options.Distributed``, which the ``DataLoader`` reads to give
each instance its share of the data). The settings ``poprun`` decides are locked:
``replicationFactor``, ``useIpuId`` and the ``Distributed`` setters raise. Outside
``poprun`` it is one instance running one replica.

>>> import popdist.poptorch
>>> opts = popdist.poptorch.Options()
>>> opts.replication_factor, opts.Distributed.numProcesses
(1, 1)
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

import popdist
import poptorch
from poptorch.options.groups import _DistributedOptions

BLOCKED_MSG = (
    "Cannot call `{name}` with popdist.poptorch.Options: poprun sets it for each instance. "
    "Change poprun's arguments (--num-replicas, --num-instances, --ipus-per-replica) instead."
)
IPUS_MSG = (
    "popdist.poptorch.Options(ipus_per_replica={got}) does not match poprun's "
    "--ipus-per-replica {want}."
)


def _blocked(name: str) -> RuntimeError:
    return RuntimeError(BLOCKED_MSG.format(name=name))


class _InstanceDistributed(_DistributedOptions):
    """This instance's place among poprun's instances, which the script cannot change."""

    @classmethod
    def of_instance(cls) -> _InstanceDistributed:
        popdist.check_layout()
        return cls(process_id=popdist.getInstanceIndex(), num_processes=popdist.getNumInstances())

    def configureProcessId(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802
        raise _blocked("Distributed.configureProcessId")

    def setEnvVarNames(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802
        raise _blocked("Distributed.setEnvVarNames")

    def disable(self, *args: Any, **kwargs: Any) -> Any:
        raise _blocked("Distributed.disable")


class Options(poptorch.Options):
    """``poptorch.Options`` for this ``poprun`` instance (see the module docstring)."""

    distributed: _InstanceDistributed = Field(default_factory=_InstanceDistributed.of_instance)

    def __init__(self, ipus_per_replica: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        want = popdist.getNumIpusPerReplica()
        if ipus_per_replica is not None:
            valid = isinstance(ipus_per_replica, int) and not isinstance(ipus_per_replica, bool)
            if not valid or ipus_per_replica < 1:
                raise ValueError(
                    f"ipus_per_replica must be a positive integer, got {ipus_per_replica!r}."
                )
            if popdist.isPopdistEnvSet() and ipus_per_replica != want:
                raise ValueError(IPUS_MSG.format(got=ipus_per_replica, want=want))
        poptorch.Options.replicationFactor(self, popdist.getNumLocalReplicas())

    def replicationFactor(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802
        raise _blocked("replicationFactor")

    def useIpuId(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802
        raise _blocked("useIpuId")
