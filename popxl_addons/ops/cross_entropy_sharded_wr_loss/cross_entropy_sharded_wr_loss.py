"""``CrossEntropyShardedWR``: cross-entropy with the classes split over IPUs of a replica.

The shards may have different numbers of classes (uneven vocabularies). Indices are global
class ids, the same tensor on every IPU. The first output is the unreduced loss; the
others are each shard's negative log-softmax. The gradient w.r.t. each shard is
``dloss * (softmax - one_hot)`` restricted to its classes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from popxl import Tensor
from popxl.tensor_spec import TensorSpec

from .._native import core_error, define, float32, jax, jnp, record

MSG = "CrossEntropyShardedWROp::setup {}"


def _check(logits: list, indices: list) -> None:
    if len(logits[0].shape) != 2:
        raise core_error(
            MSG.format("all logits must be of rank 2. e.g. (n_samples, sub_n_classes)")
        )
    samples = logits[0].shape[0]
    for t in logits:
        if t.dtype != logits[0].dtype:
            raise core_error(MSG.format("not all logits inputs have the same datatype."))
        if len(t.shape) != 2:
            raise core_error(
                MSG.format("all logits must be of rank 2. e.g. (n_samples, sub_n_classes)")
            )
        if t.shape[0] != samples:
            raise core_error(MSG.format("all logits must have the same number of samples."))
    for t in indices:
        if t.dtype != indices[0].dtype:
            raise core_error(MSG.format("not all indices inputs have the same datatype."))
        if len(t.shape) != 1:
            raise core_error(MSG.format("all indices must be of rank 1. e.g. (n_samples,)"))
        if t.shape[0] != samples:
            raise core_error(MSG.format("all indices and logits must have the same token number"))


def _infer(*specs: Any, shards: int) -> list:
    logits, indices = list(specs[:shards]), list(specs[shards:])
    _check(logits, indices)
    loss = TensorSpec(logits[0].shape[:1], logits[0].dtype)
    return [loss] + [TensorSpec(t.shape, t.dtype) for t in logits]


def _lower(*arrays: Any, shards: int) -> tuple:
    logits, labels = arrays[:shards], arrays[shards].astype(jnp.int32)
    full = float32(jnp.concatenate(logits, axis=1))
    nls = jax.nn.log_softmax(full, axis=1)
    loss = -jnp.take_along_axis(nls, labels[:, None], axis=1)[:, 0]
    bounds = [0]
    for x in logits:
        bounds.append(bounds[-1] + x.shape[1])
    parts = [-nls[:, a:b] for a, b in zip(bounds, bounds[1:])]
    return (loss, *parts)


CROSS_ENTROPY_SHARDED_WR = define(
    "cross_entropy_sharded_wr", "CrossEntropyShardedWR", _infer, _lower
)


def _ipus_of(ts: list[Tensor], ipus: Iterable[int] | None) -> list[int]:
    if ipus is None:
        try:
            return [t.ipu for t in ts]
        except Exception as e:
            raise ValueError(
                "Could not automatically infer the IPU of all input Tensors. "
                "Please specify the IPUs via the `ipus` parameter."
            ) from e
    ipus = list(ipus)
    if len(ts) != len(ipus):
        raise ValueError(
            "Number of specified tensor does not equal number of specified IPUs. "
            f"{len(ts)} != {len(ipus)}"
        )
    return ipus


def cross_entropy_sharded_wr_loss(
    logits: list[Tensor], indices: list[Tensor], ipus: Iterable[int] | None = None
) -> Tensor:
    """Cross-entropy of logits split over the classes axis across IPUs of one replica.

    Args:
        logits: one ``(n_samples, n_classes_i)`` tensor per IPU (sizes may differ).
        indices: one ``(n_samples,)`` tensor of global class ids per IPU (copies).
        ipus: the IPU of each shard (default: inferred from the logits).

    Returns:
        The unreduced loss ``(n_samples,)``.

    Raises:
        ValueError: different numbers of logits and indices, undetermined or mismatched
            IPUs.
        popxl.errors.PopXLException: wrong ranks, dtypes or sample counts.
    """
    logits, indices = list(logits), list(indices)
    if len(logits) != len(indices):
        raise ValueError("You must provide the same number of logits and indices.")
    ipus = _ipus_of(logits, ipus)
    if _ipus_of(indices, ipus) != ipus:
        raise ValueError("The logits and indices IPUs do not match.")
    n = len(logits)
    inputs = {f"logits_{i}": t for i, t in enumerate(logits)}
    inputs.update({f"indices_{i}": t for i, t in enumerate(indices)})
    names = ["cross_entropy_sharded_out"] + [
        f"cross_entropy_sharded_soft_max_out_{i}" for i in range(n)
    ]
    return record(CROSS_ENTROPY_SHARDED_WR, inputs, {"shards": n}, names, check_placement=False)[0]


__all__ = ["cross_entropy_sharded_wr_loss"]
