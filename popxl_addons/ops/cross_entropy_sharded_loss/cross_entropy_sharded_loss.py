"""``CrossEntropySharded``: softmax cross-entropy with the classes sharded over replicas.

Each replica of a group holds ``(n_samples, n_classes / group_size)`` logits. The forward
computes the global log-softmax with two all-reduces (max, then the sum of exponentials)
and picks the true class's value on the replica that holds it (a third all-reduce), so
every replica gets the same loss. The gradient is the original's: each replica returns
``dloss * (softmax - one_hot)`` for its own classes, with no communication (the incoming
loss gradient is the same on every replica).
"""

from __future__ import annotations

from typing import Any, Literal

from popxl import ReplicaGrouping, Tensor, ops
from popxl.tensor_spec import TensorSpec

from .._native import all_reduce, core_error, float32, groups_of, jax, jnp, record, replica_op

REDUCTION_TYPE = Literal["mean", "sum", "none"]

RANK_MSG = {
    "logits": "CrossEntropyShardedOp::setup logits must be of rank 2. e.g. (n_samples, sharded_n_classes)",
    "indices": "CrossEntropyShardedOp::setup indices must be of rank 1. e.g. (n_samples,)",
    "samples": (
        "CrossEntropyShardedOp::setup indices and logits must have the same number of samples. "
        "shapes should be logits=(n_samples, sharded_n_classes); indices=(n_samples,)"
    ),
}


def _infer(logits: Any, indices: Any, **_: Any) -> list:
    if len(logits.shape) != 2:
        raise core_error(RANK_MSG["logits"])
    if len(indices.shape) != 1:
        raise core_error(RANK_MSG["indices"])
    if logits.shape[0] != indices.shape[0]:
        raise core_error(RANK_MSG["samples"])
    return [TensorSpec(logits.shape[:1], logits.dtype), TensorSpec(logits.shape, logits.dtype)]


def _neg_log_softmax(x: Any, groups: Any, impl: str) -> Any:
    top = all_reduce(jnp.max(x, axis=1), "max", groups, impl)
    shifted = x - top[:, None]
    total = all_reduce(jnp.sum(jnp.exp(shifted), axis=1), "add", groups, impl)
    return jnp.log(total)[:, None] - shifted


def _own_class(indices: Any, classes: int) -> tuple[Any, Any]:
    """(in range on this shard, index clipped into range)."""
    mine = (indices >= 0) & (indices < classes)
    return mine, jnp.clip(indices, 0, classes - 1).astype(jnp.int32)


def sharded_cross_entropy(logits: Any, indices: Any, groups: Any, impl: str) -> tuple:
    """(loss, negative log-softmax) of this replica's shard, with the original's gradient."""
    classes = logits.shape[1]

    def forward(x: Any, idx: Any) -> tuple:
        nls = _neg_log_softmax(float32(x), groups, impl)
        mine, safe = _own_class(idx, classes)
        picked = jnp.take_along_axis(nls, safe[:, None], axis=1)[:, 0]
        loss = all_reduce(jnp.where(mine, picked, 0.0), "add", groups, impl)
        return (loss.astype(x.dtype), nls.astype(x.dtype)), (nls, idx)

    def backward(saved: tuple, cts: tuple) -> tuple:
        nls, idx = saved
        dloss = float32(cts[0])
        mine, safe = _own_class(idx, classes)
        grad = jnp.exp(-nls) * dloss[:, None]
        hit = jax.nn.one_hot(safe, classes, dtype=grad.dtype) * mine[:, None]
        return ((grad - hit * dloss[:, None]).astype(cts[0].dtype), None)

    fn = jax.custom_vjp(lambda x, idx: forward(x, idx)[0])
    fn.defvjp(forward, backward)
    return fn(logits, indices)


def _lower(logits: Any, indices: Any, *, groups: Any, amp: float, impl: str) -> tuple:
    return sharded_cross_entropy(logits, indices, groups, impl)


CROSS_ENTROPY_SHARDED = replica_op(
    "cross_entropy_sharded", "CrossEntropySharded", _infer, _lower, nondiff_inputs=(1,)
)


def cross_entropy_sharded_loss(
    logits: Tensor,
    indices: Tensor,
    ignore_index: Tensor | None = None,
    replica_grouping: ReplicaGrouping | None = None,
    reduction: REDUCTION_TYPE = "mean",
    available_memory_proportion: float = 0.4,
) -> Tensor:
    """Tensor-parallel cross-entropy: logits sharded over the classes of a replica group.

    Args:
        logits: ``(n_samples, sharded_n_classes)``, this replica's classes. Flatten batch
            and sequence axes first.
        indices: ``(n_samples,)`` true classes, already offset by this shard's first class
            (so they are negative or out of range on the shards that do not hold them).
        ignore_index: a tensor of this shard's adjusted index whose samples do not count
            (nor contribute to the gradient).
        replica_grouping: the tensor-parallel group (default: all replicas).
        reduction: ``"mean"`` (over the samples not ignored), ``"sum"`` or ``"none"``.
        available_memory_proportion: accepted for compatibility; it tuned the IPU's
            multi-slice and has no effect here.

    Returns:
        The loss, identical on every replica of the group (``(n_samples,)`` for ``none``).

    Raises:
        popxl.errors.PopXLException: wrong ranks or sample counts.
        ValueError: unknown ``reduction``.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(
            f"`reduction` should be one of `mean`, `sum` and `none`. Passed: {reduction}"
        )
    attrs = {"groups": groups_of(replica_grouping), "amp": float(available_memory_proportion)}
    names = ["cross_entropy_sharded_out", "cross_entropy_sharded_soft_max_out"]
    loss = record(CROSS_ENTROPY_SHARDED, {"logits": logits, "indices": indices}, attrs, names)[0]
    mask = None
    if ignore_index is not None:
        mask = ops.cast(ops.logical_not(ops.equal(indices, ignore_index)), loss.dtype)
        loss = loss * mask
    if reduction == "mean":
        return ops.sum(loss) / ops.sum(mask) if mask is not None else ops.mean(loss)
    if reduction == "sum":
        return ops.sum(loss)
    return loss


__all__ = ["cross_entropy_sharded_loss"]
