"""Host-side NumPy helpers for laying out data across replicas: shard, repeat, pad, squeeze.

``shard`` puts the pieces of an axis on a new leading axis (the replica axis of host
layouts); ``unshard`` undoes it. ``shard2D``/``unshard2D`` do the same over two axes, and
``tensor_parallel_input`` repeats samples for the replicas of a tensor-parallel group.

Note the name clash: ``popxl_addons.repeat`` is this NumPy helper, not ``popxl.ops.repeat``.

>>> shard(np.arange(8).reshape(4, 2), 2, 1).shape
(2, 4, 1)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from popxl.utils import to_numpy

RANK_MISMATCH_MSG = "All arrays must be of the same rank to be unsharded. Ranks: {ranks}"
REPEAT_SHARD_MSG = "sharded_tensor should be either 'contiguous' or 'strided'. Not: {value}"
TP_MSG = (
    "Tensor-parallel size tp={tp} must divide the replication factor rf={rf} (and be at most "
    "rf): each group of tp consecutive replicas gets the same sample."
)


def _host(x: object) -> np.ndarray:
    """Host data (arrays, torch tensors) as NumPy through PopXL's one conversion, dtype kept."""
    return to_numpy(x, downcast=False, copy=False)


def handle_negative_axis(x: np.ndarray, axis: int) -> int:
    """``axis`` as a non-negative index into ``x``'s dimensions.

    Raises:
        IndexError: ``x`` is 0-dimensional, or ``axis`` is outside ``[-x.ndim, x.ndim)``.
    """
    if x.ndim == 0:
        raise IndexError("Array is 0-dimensional, so it has no axis to index.")
    if not -x.ndim <= axis < x.ndim:
        raise IndexError(f"Axis is out of range. Axis: {axis}. Array Rank: {x.ndim}")
    return axis + x.ndim if axis < 0 else axis


def shard(x: np.ndarray, n: int, axis: int) -> np.ndarray:
    """Split ``axis`` into ``n`` equal pieces stacked on a new leading axis.

    >>> shard(np.arange(8).reshape(4, 2), 2, 0).tolist()
    [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    >>> shard(np.arange(8).reshape(4, 2), 2, 1)[:, :, 0].tolist()
    [[0, 2, 4, 6], [1, 3, 5, 7]]

    Raises:
        ValueError: the axis length is not divisible by ``n`` (from ``np.split``).
    """
    x = _host(x)
    axis = handle_negative_axis(x, axis)
    return np.stack(np.split(x, n, axis=axis))


def unshard_arrays(xs: Sequence[np.ndarray], axis: int) -> np.ndarray:
    """Concatenate arrays that each have a leading axis of size 1 on ``axis`` and drop it.

    ``axis`` counts the dimensions after the leading one; a negative axis counts from the
    end as usual.

    Raises:
        ValueError: the arrays have different ranks.
    """
    xs = [_host(x) for x in xs]
    if len({x.ndim for x in xs}) > 1:
        raise ValueError(RANK_MISMATCH_MSG.format(ranks=", ".join(str(x.ndim) for x in xs)))
    at = axis + 1 if axis >= 0 else handle_negative_axis(xs[0], axis)
    return np.concatenate(xs, axis=at).squeeze(0)


def unshard(x: np.ndarray, axis: int) -> np.ndarray:
    """The inverse of ``shard``: concatenate the leading axis's pieces on ``axis``.

    >>> data = np.arange(24).reshape(2, 3, 4)
    >>> bool((unshard(shard(data, 2, 2), 2) == data).all())
    True
    """
    x = _host(x)
    return unshard_arrays(np.split(x, x.shape[0], axis=0), axis)


def repeat(x: np.ndarray, n: int, axis: int = 0) -> np.ndarray:
    """Insert a new axis at ``axis`` and repeat ``x`` ``n`` times along it.

    >>> repeat(np.arange(3), 2, 0).tolist()
    [[0, 1, 2], [0, 1, 2]]

    See also: ``np.repeat``, ``np.broadcast_to``.
    """
    return np.repeat(np.expand_dims(x, axis), n, axis=axis)


def repeat_axis(x: np.ndarray, n: int, axis: int = 0) -> np.ndarray:
    """Tile ``x`` ``n`` times along an existing axis.

    >>> repeat_axis(np.arange(4).reshape(2, 2), 2, 1).tolist()
    [[0, 1, 0, 1], [2, 3, 2, 3]]
    """
    x = _host(x)
    reps = [1] * x.ndim
    reps[axis] = n
    return np.tile(x, reps)


def split2D(x: np.ndarray, n1: int, n2: int, a1: int, a2: int) -> list[list[np.ndarray]]:  # noqa: N802
    """Blocks of ``x``: ``n1`` pieces along ``a1``, each cut into ``n2`` pieces along ``a2``."""
    return [np.split(part, n2, axis=a2) for part in np.split(_host(x), n1, axis=a1)]


def shard2D(x: np.ndarray, n1: int, n2: int, a1: int, a2: int) -> np.ndarray:  # noqa: N802
    """The ``split2D`` blocks stacked on a new axis 0, ``a1`` outer and ``a2`` inner.

    >>> shard2D(np.arange(8).reshape(4, 2), 2, 2, 0, 1)[:, :, 0].tolist()
    [[0, 2], [1, 3], [4, 6], [5, 7]]
    """
    return np.stack([block for row in split2D(x, n1, n2, a1, a2) for block in row])


def unshard2D(x: np.ndarray, n1: int, n2: int, a1: int, a2: int) -> np.ndarray:  # noqa: N802
    """The inverse of ``shard2D`` (``a1``/``a2`` count the dimensions after axis 0).

    Raises:
        ValueError: ``x.shape[0]`` is not ``n1 * n2``.
    """
    x = _host(x)
    if x.shape[0] != n1 * n2:
        raise ValueError(
            f"unshard2D expects n1*n2 = {n1}*{n2} = {n1 * n2} blocks on axis 0, got {x.shape[0]}."
        )
    blocks = np.split(x, x.shape[0], axis=0)
    rows = [unshard_arrays(blocks[i : i + n2], a2) for i in range(0, len(blocks), n2)]
    return np.concatenate(rows, axis=a1)


def repeat_shard(
    x: np.ndarray,
    n_repeats: int,
    n_shards: int,
    shard_axis: int,
    sharded_tensor: Literal["contiguous", "strided"] = "contiguous",
) -> np.ndarray:
    """Shard ``x`` then repeat the shards: ``[s0, s1, s0, s1]`` (contiguous) or
    ``[s0, s0, s1, s1]`` (strided).

    >>> repeat_shard(np.arange(4), 2, 2, 0, "strided").tolist()
    [[0, 1], [0, 1], [2, 3], [2, 3]]

    Raises:
        ValueError: ``sharded_tensor`` is neither ``"contiguous"`` nor ``"strided"``.
    """
    if sharded_tensor not in ("contiguous", "strided"):
        raise ValueError(REPEAT_SHARD_MSG.format(value=sharded_tensor))
    shards = shard(x, n_shards, shard_axis)
    if sharded_tensor == "contiguous":
        return repeat_axis(shards, n_repeats, 0)
    return np.repeat(shards, n_repeats, axis=0)


def _check_tp(tp: int, rf: int) -> None:
    if tp < 1 or tp > rf or rf % tp:
        raise ValueError(TP_MSG.format(tp=tp, rf=rf))


def tensor_parallel_input(
    input_data: np.ndarray,
    tp: int,
    rf: int,
    repeat_fn: Callable[[np.ndarray, int], np.ndarray] | None = None,
) -> np.ndarray:
    """Host input for ``rf`` replicas in tensor-parallel groups of ``tp`` consecutive replicas.

    Each sample of ``input_data`` (shape ``[n, *shape]``) goes to the ``tp`` replicas of one
    group, copy ``i`` optionally transformed by ``repeat_fn(copy, i)``. The result has shape
    ``[n * tp / rf, rf, *shape]`` with axes 0 and 1 squeezed when they have size 1.

    >>> tensor_parallel_input(np.arange(4), 2, 4).tolist()
    [[0, 0, 1, 1], [2, 2, 3, 3]]

    Raises:
        ValueError: ``tp > rf`` or ``rf`` not divisible by ``tp`` (the original asserted).
    """
    _check_tp(tp, rf)
    data = np.expand_dims(_host(input_data), axis=1)
    copies = [repeat_fn(data.copy(), i) if repeat_fn else data for i in range(tp)]
    stacked = np.concatenate(copies, axis=1)
    return squeeze_safe(stacked.reshape(-1, rf, *data.shape[2:]), [0, 1])


def tensor_parallel_output(
    output_data: np.ndarray,
    num_host_transfers: int,
    tp: int,
    rf: int,
    data_shape: Sequence[int],
    tp_identical: bool = True,
    true_num_host_transfers: int | None = None,
) -> np.ndarray:
    """Per-sample outputs from host output laid out as ``(nht, dp, tp, *data_shape)``.

    Samples are ordered host transfer first, then data-parallel replica, so this undoes
    ``tensor_parallel_input``. With ``tp_identical`` the tp replicas of a group hold the
    same value and the first is kept: ``(samples, *data_shape)``; otherwise every copy is
    kept: ``(samples, tp, *data_shape)``. ``true_num_host_transfers`` drops padding
    transfers at the end. Not in ``__all__`` (as in the original).

    Raises:
        ValueError: ``tp`` does not divide ``rf``, or the data has the wrong size.
    """
    _check_tp(tp, rf)
    x = _host(output_data).reshape(num_host_transfers, rf // tp, tp, *data_shape)
    if true_num_host_transfers is not None:
        x = x[:true_num_host_transfers]
    if tp_identical:
        x = x[:, :, 0]
    return x.reshape(-1, *x.shape[2:])


def pad_axis(x: np.ndarray, n: int, axis: int, value: float = 0) -> np.ndarray:
    """Pad ``axis`` at its end with ``value`` up to length ``n``.

    >>> pad_axis(np.arange(2), 4, 0).tolist()
    [0, 1, 0, 0]

    Raises:
        ValueError: the axis is already longer than ``n``.
    """
    x = _host(x)
    if x.shape[axis] > n:
        raise ValueError(f"Axis {axis} has length {x.shape[axis]}, longer than the target {n}.")
    padding = [(0, 0)] * x.ndim
    padding[axis] = (0, n - x.shape[axis])
    return np.pad(x, padding, constant_values=value)


def squeeze_safe(x: np.ndarray, axis: int | Sequence[int] | None = None) -> np.ndarray:
    """``np.squeeze`` that skips listed axes whose size is not 1 instead of raising.

    ``axis=None`` squeezes every size-1 axis. Negative axes are allowed and duplicates are
    ignored.

    >>> squeeze_safe(np.zeros((1, 2, 1)), [0, 1, -1]).shape
    (2,)

    Raises:
        IndexError: an axis out of range.
    """
    x = _host(x)
    if axis is None:
        return np.squeeze(x)
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    for ax in sorted({handle_negative_axis(x, int(a)) for a in axes}, reverse=True):
        if x.shape[ax] == 1:
            x = np.squeeze(x, axis=ax)
    return x


__all__ = [
    "shard", "unshard_arrays", "unshard", "repeat", "repeat_axis", "split2D", "shard2D",
    "unshard2D", "repeat_shard", "tensor_parallel_input", "pad_axis", "squeeze_safe",
    "handle_negative_axis",
]  # fmt: skip
