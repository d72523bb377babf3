"""``seed_variable``: a random-seed variable that works with replica groupings."""

from __future__ import annotations

import popxl
from popxl import ops
from popxl.context import _execution_context


def seed_variable(
    seed: int, replica_grouping: popxl.ReplicaGrouping | None = None
) -> tuple[popxl.Variable, popxl.Tensor]:
    """A seed held in a remote variable, and the tensor to pass to random ops.

    Like ``popxl.replica_sharded_variable`` it returns two tensors: the variable (read and
    write it with the session: ``session.get_tensor_data(seed_var)``) and a ``(2,)`` uint32
    tensor of the main graph that holds its value on the device. The value is loaded from
    the variable's remote buffer in the weights-from-host fragment and stored back in the
    weights-to-host fragment, so in-place updates of the tensor reach the variable.

    Each replica group gets its own seed from ``popxl.create_seeds(seed, replicas=
    num_groups)``; replicas in one group share it.

    Args:
        seed: the host seed the device seeds are derived from.
        replica_grouping: which replicas share a seed. Default: every replica has its own
            (``ir.replica_grouping(group_size=1)``).

    Returns:
        ``(seed_variable, seed_tensor)``.
    """
    grouping = replica_grouping or popxl.gcg().ir.replica_grouping(group_size=1)
    values = popxl.create_seeds(seed, replicas=grouping.num_groups)
    buffer = popxl.remote_buffer((2,), popxl.uint32)
    seed_var = popxl.remote_variable(values, buffer, replica_grouping=grouping, name="random_seed")
    with popxl.gmg():
        with _execution_context("WeightsFromHostFragment"):
            seed_t = ops.remote_load(buffer, 0, "random_seed_h2d")
        with _execution_context("WeightsToHostFragment"):
            ops.remote_store(buffer, 0, seed_t)
    return seed_var, seed_t


__all__ = ["seed_variable"]
