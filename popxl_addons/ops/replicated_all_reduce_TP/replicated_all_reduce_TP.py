"""All-reduces for tensor parallelism (Megatron's ``f``/``g`` pair), as one op kind.

``ReplicatedAllReduceTP`` carries two flags. With ``identical_inputs`` the inputs are
known to be equal on every replica of the group, so the forward is an identity and the
gradient an all-reduce (``f``: before a column-sharded matmul). With
``identical_grad_inputs`` the forward is an all-reduce and the gradient an identity (``g``:
after a row-sharded matmul). With neither, both directions all-reduce. The gradient op is
the same op with the flags swapped, as in the original.

As in the original, an op with ``identical_inputs`` (the forward of ``f``, the gradient of
``g``) only becomes an identity through PopART's ``OpToIdentityPattern``: run
``popxl_addons.patterns.apply_pre_alias_patterns(ir)`` after autodiff; a session created
before that raises ``PopXLException`` (the original's Opx raised ``popart_exception``).
"""

from __future__ import annotations

from popxl import ReplicaGrouping, Tensor
from popxl.ops.collectives import CollectiveOps

from .._native import define_all_reduce_pair, record_all_reduce_pair

ALL_REDUCE_TP = define_all_reduce_pair(
    "replicated_all_reduce_TP", "ReplicatedAllReduceTP", "replicated_all_reduce"
)
_ADD_ONLY = ("add",)


def _all_reduce_tp(
    t: Tensor, op: str, group: ReplicaGrouping | None, inputs: bool, grad_inputs: bool
) -> Tensor:
    return record_all_reduce_pair(
        ALL_REDUCE_TP, t, op, group, _ADD_ONLY, inputs, grad_inputs, "replicated_all_reduce_TP_out"
    )


def replicated_all_reduce_identical_inputs(
    t: Tensor, op: CollectiveOps = "add", group: ReplicaGrouping | None = None
) -> Tensor:
    """All-reduce of inputs known to be identical: forward identity, gradient all-reduce.

    Args:
        t: the per-replica tensor (equal on the replicas of each group).
        op: the reduction; only ``"add"`` is implemented.
        group: the replicas to reduce across (default: all).

    Raises:
        popxl.errors.PopXLException: ``op`` is not ``"add"``.
    """
    return _all_reduce_tp(t, op, group, True, False)


def replicated_all_reduce_identical_grad_inputs(
    t: Tensor, op: CollectiveOps = "add", group: ReplicaGrouping | None = None
) -> Tensor:
    """All-reduce whose incoming gradients are identical: forward all-reduce, gradient
    identity. Arguments as ``replicated_all_reduce_identical_inputs``."""
    return _all_reduce_tp(t, op, group, False, True)


def replicated_all_reduce(
    t: Tensor, op: CollectiveOps = "add", group: ReplicaGrouping | None = None
) -> Tensor:
    """Differentiable all-reduce: forward and gradient both all-reduce. Arguments as
    ``replicated_all_reduce_identical_inputs``."""
    return _all_reduce_tp(t, op, group, False, False)


__all__ = [
    "replicated_all_reduce_identical_inputs",
    "replicated_all_reduce_identical_grad_inputs",
    "replicated_all_reduce",
]
