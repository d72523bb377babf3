"""``LayerNormDistributed``: layer norm with the hidden axis sharded over a replica group.

Each replica holds ``(n, hidden / group_size)``. The mean and variance are over the whole
hidden axis: their partial sums are all-reduced over the group. The gradient is the
original's: the input gradient all-reduces its two row sums, the scale and bias gradients
stay local (each replica owns its slice of them).
"""

from __future__ import annotations

from typing import Any

import popxl
from popxl import ReplicaGrouping
from popxl.tensor_spec import TensorSpec

from .._native import all_reduce, float32, group_size, groups_of, jax, jnp, record, replica_op


def _infer(x: Any, w: Any, b: Any, **_: Any) -> list:
    rows = x.shape[:1]
    return [TensorSpec(x.shape, x.dtype), TensorSpec(rows, x.dtype), TensorSpec(rows, x.dtype)]


def distributed_layer_norm(x: Any, w: Any, b: Any, epsilon: float, groups: Any, impl: str) -> tuple:
    """(y, mean, inverse standard deviation) of this replica's hidden slice."""
    hidden = x.shape[1] * group_size(groups)

    def row_sum(v: Any) -> Any:
        return all_reduce(jnp.sum(v, axis=1), "add", groups, impl)

    def stats(xf: Any) -> tuple:
        mean = row_sum(xf) / hidden
        centred = xf - mean[:, None]
        inv_std = jax.lax.rsqrt(row_sum(centred * centred) / hidden + epsilon)
        return mean, inv_std, centred * inv_std[:, None]

    def forward(x: Any, w: Any, b: Any) -> tuple:
        mean, inv_std, whitened = stats(float32(x))
        y = whitened * float32(w) + float32(b)
        dtype = x.dtype
        return (y.astype(dtype), mean.astype(dtype), inv_std.astype(dtype)), (whitened, inv_std, w)

    def backward(saved: tuple, cts: tuple) -> tuple:
        whitened, inv_std, w = saved
        dy = float32(cts[0])
        g = dy * float32(w)
        mean_g = row_sum(g) / hidden
        mean_gx = row_sum(g * whitened) / hidden
        dx = inv_std[:, None] * (g - mean_g[:, None] - whitened * mean_gx[:, None])
        dw = jnp.sum(dy * whitened, axis=0)
        db = jnp.sum(dy, axis=0)
        return dx.astype(cts[0].dtype), dw.astype(w.dtype), db.astype(w.dtype)

    fn = jax.custom_vjp(lambda x, w, b: forward(x, w, b)[0])
    fn.defvjp(forward, backward)
    return fn(x, w, b)


def _lower(x: Any, w: Any, b: Any, *, epsilon: float, groups: Any, impl: str) -> tuple:
    return distributed_layer_norm(x, w, b, epsilon, groups, impl)


LAYER_NORM_DISTRIBUTED = replica_op(
    "layer_norm_distributed", "LayerNormDistributed", _infer, _lower
)

RANK_MSG = "layer_norm_distributed: {name} must have rank {rank}, got shape {shape}."


def layer_norm_distributed(
    t: popxl.Tensor,
    w: popxl.Tensor,
    b: popxl.Tensor,
    epsilon: float = 1e-5,
    group: ReplicaGrouping | None = None,
) -> popxl.Tensor:
    """Layer-normalise ``t``, whose hidden axis is sharded over the replicas of ``group``.

    Args:
        t: ``(n, hidden / group_size)``, this replica's slice of the hidden axis.
        w: ``(hidden / group_size,)`` scale (gamma) slice.
        b: ``(hidden / group_size,)`` shift (beta) slice.
        epsilon: added to the variance.
        group: the replicas sharing the hidden axis (default: all).

    Returns:
        ``(n, hidden / group_size)``: this replica's slice of the normalised tensor.

    Raises:
        ValueError: wrong ranks (the original asserted them).
    """
    for name, tensor, rank in (("t", t, 2), ("w", w, 1), ("b", b, 1)):
        if tensor.rank != rank:
            raise ValueError(RANK_MSG.format(name=name, rank=rank, shape=tensor.shape))
    attrs = {"epsilon": float(epsilon), "groups": groups_of(group)}
    return record(
        LAYER_NORM_DISTRIBUTED, {"t": t, "w": w, "b": b}, attrs, ["outputs", "mean", "std"]
    )[0]


__all__ = ["layer_norm_distributed"]
