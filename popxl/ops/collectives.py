"""Collectives between replicas (and ``all_reduce`` between IPUs of one replica).

Replicas of the per-replica program are mapped over a named axis (``REPLICA_AXIS``); the
lowerings here use JAX's collectives on it. A ``group`` (``ReplicaGrouping``) restricts a
collective to the replicas of each group; a replica's *rank* is its position in its group's
sorted member list. Grouped collectives are computed from an all-gather over every replica
(``axis_index_groups`` is unavailable under ``vmap``); the all-replica group uses the native
``psum``/``pmax``/``pmin`` directly.

Reduction ops: ``add``, ``mean``, ``mul``, ``min``, ``max``, ``and``, ``or``, ``square_add``
(sum of squares). Deliberate fix: ``"mul"`` multiplies (the original mapped it to mean).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from typing import Any, Literal

from .. import context
from .._op import define
from ..replica_grouping import ReplicaGrouping
from ..tensor import Tensor
from ._base import jnp, lax, normalize_axis, record, same_dtype, spec

REPLICA_AXIS = "replica"
CollectiveOps = Literal["add", "mean", "mul", "min", "max", "and", "or", "square_add"]
OPS = ("add", "mean", "mul", "min", "max", "and", "or", "square_add")
OutputShape = Literal["new_axis", "concat", "meta_shape", "auto"]

# (replicas, members of each replica's group in rank order, rank of each replica)
Groups = tuple[int, tuple[tuple[int, ...], ...], tuple[int, ...]]


class CommGroupType(enum.Enum):
    """How replicas are grouped for a collective (PopART's ``CommGroupType``)."""

    All = "All"
    Consecutive = "Consecutive"
    Orthogonal = "Orthogonal"
    Ungrouped = "Ungrouped"


class CommGroup:
    """A ``CommGroupType`` and a group size, as in PopART."""

    def __init__(self, type: CommGroupType = CommGroupType.All, replicaGroupSize: int = 0) -> None:  # noqa: A002,N803
        self.type = type
        self.replicaGroupSize = replicaGroupSize

    def __repr__(self) -> str:
        return f"CommGroup(type={self.type}, replicaGroupSize={self.replicaGroupSize})"


# Group tables ----------------------------------------------------------------------------


def _groups(group: ReplicaGrouping | None) -> Groups:
    ir = context.get_current_graph().ir
    grouping = group or ir.replica_grouping()
    replicas = ir.replication_factor
    members = grouping.members
    by_replica: list[tuple[int, ...]] = [()] * replicas
    ranks = [0] * replicas
    for ms in members:
        for rank, r in enumerate(ms):
            by_replica[r] = tuple(ms)
            ranks[r] = rank
    return replicas, tuple(by_replica), tuple(ranks)


def _group_size(groups: Groups) -> int:
    return len(groups[1][0])


def _check_op(op: str) -> str:
    if op not in OPS:
        raise ValueError(f"Not a valid op: {op!r}. Valid collective ops: {', '.join(OPS)}.")
    return op


# Lowering helpers --------------------------------------------------------------------------
#
# ``impl`` is chosen by the runtime: "native" uses JAX's collectives where they exist;
# "gather" computes every reduction from an all-gather and an unrolled fold over the
# replicas, which is much faster under ``jax.vmap`` (where ``psum`` becomes a slow reduction
# over the mapped axis on CPU). "summed" means the runtime has already summed the input over
# every replica (see ``sums_every_replica``).


def _fold(values: list, op: str) -> Any:
    """Reduce a list of equally shaped arrays (the group members, in rank order)."""
    if op == "square_add":
        values = [v * v for v in values]
    combine = {
        "add": jnp.add,
        "mean": jnp.add,
        "square_add": jnp.add,
        "mul": jnp.multiply,
        "min": jnp.minimum,
        "max": jnp.maximum,
        "and": jnp.logical_and,
        "or": jnp.logical_or,
    }[op]
    out = values[0]
    for v in values[1:]:
        out = combine(out, v)
    return out / len(values) if op == "mean" else out


def _unique_groups(groups: Groups) -> list[tuple[int, ...]]:
    return list(dict.fromkeys(groups[1]))


def _per_replica(values: list, groups: Groups) -> Any:
    """Pick this replica's entry of a per-group list of values."""
    if len(values) == 1:
        return values[0]
    unique = _unique_groups(groups)
    index = jnp.asarray([unique.index(g) for g in groups[1]], dtype=jnp.int32)
    return jnp.stack(values)[index[lax.axis_index(REPLICA_AXIS)]]


def _members(x: Any, groups: Groups) -> Any:
    """``(group_size, *x.shape)``: this replica's group members' values, in rank order."""
    gathered = lax.all_gather(x, REPLICA_AXIS)
    if _group_size(groups) == groups[0]:
        return gathered
    return _per_replica([gathered[jnp.asarray(g)] for g in _unique_groups(groups)], groups)


def _rank(groups: Groups) -> Any:
    return jnp.asarray(groups[2], dtype=jnp.int32)[lax.axis_index(REPLICA_AXIS)]


_NATIVE = {"add": "psum", "mean": "pmean", "min": "pmin", "max": "pmax"}


def _all_reduce(x: Any, *, op: str, groups: Groups, impl: str = "native") -> Any:
    replicas = groups[0]
    size = _group_size(groups)
    if impl == "summed":  # the runtime already summed ``x`` over every replica
        return x / replicas if op == "mean" else x
    if size == 1:
        return x * x if op == "square_add" else x
    if impl == "native" and size == replicas and op in _NATIVE:
        return getattr(lax, _NATIVE[op])(x, REPLICA_AXIS)
    gathered = lax.all_gather(x, REPLICA_AXIS)
    results = [_fold([gathered[m] for m in g], op) for g in _unique_groups(groups)]
    return _per_replica(results, groups).astype(x.dtype)


def _flat_padded(x: Any, size: int) -> Any:
    flat = x.reshape(-1)
    pad = (-flat.shape[0]) % size
    return jnp.pad(flat, (0, pad)) if pad else flat


def _my_chunk(flat: Any, groups: Groups) -> Any:
    size = _group_size(groups)
    chunk = flat.shape[0] // size
    if size == 1:
        return flat
    return lax.dynamic_slice_in_dim(flat, _rank(groups) * chunk, chunk)


# all_reduce -----------------------------------------------------------------------------


def sums_every_replica(op: Any) -> bool:
    """Whether ``op`` is an all-reduce or reduce-scatter that adds (or averages) its input
    over every replica, so the runtime may hand it the replica sum (``impl="summed"``)."""
    if op.opdef.key not in (
        "replicated_all_reduce",
        "replicated_all_reduce_",
        "replicated_reduce_scatter",
    ):
        return False
    groups = op.attrs["groups"]
    return op.attrs["op"] in ("add", "mean") and groups[0] > 1 and _group_size(groups) == groups[0]


def _same_infer(t: Any, **_: Any) -> list:
    return [t]


ALL_REDUCE = define(
    "replicated_all_reduce",
    "ReplicatedAllReduce",
    _same_infer,
    _all_reduce,
    effect=True,
    special="collective",
)
ALL_REDUCE_ = define(
    "replicated_all_reduce_",
    "ReplicatedAllReduceInplace",
    _same_infer,
    _all_reduce,
    modifies=((0, 0),),
    alias_outputs=((0, 0),),
    effect=True,
    special="collective",
)


def replicated_all_reduce(
    t: Tensor, op: CollectiveOps = "add", group: ReplicaGrouping | None = None
) -> Tensor:
    """Reduce ``t`` over the replicas of each group; every member gets the result.

    Args:
        t: the per-replica tensor.
        op: the reduction (``add``, ``mean``, ``mul``, ``min``, ``max``, ``and``, ``or``,
            ``square_add``).
        group: the replica grouping (default: all replicas).
    """
    attrs = {"op": _check_op(op), "groups": _groups(group)}
    return record(ALL_REDUCE, {"t": t}, attrs, [f"{t.name}_all_reduce"])[0]


def replicated_all_reduce_(
    t: Tensor, op: CollectiveOps = "add", group: ReplicaGrouping | None = None
) -> Tensor:
    """In-place ``replicated_all_reduce``."""
    attrs = {"op": _check_op(op), "groups": _groups(group)}
    return record(ALL_REDUCE_, {"t": t}, attrs, [f"{t.name}_all_reduce"])[0]


# all_gather / slice --------------------------------------------------------------------------


def _gather_shape(
    shape: tuple[int, ...], meta: tuple[int, ...], *, axis: int, mode: str, groups: Groups
) -> tuple:
    size = _group_size(groups)
    if mode == "new_axis":
        return (size, *shape)
    if mode == "meta_shape":
        return meta
    shape = shape or (1,)  # a scalar gathers like a one-element vector
    return shape[:axis] + (shape[axis] * size,) + shape[axis + 1 :]


def _all_gather_infer(t: Any, *, axis: int, mode: str, groups: Groups, **_: Any) -> list:
    return [
        spec(_gather_shape(t.shape, t.meta_shape, axis=axis, mode=mode, groups=groups), t.dtype)
    ]


def _all_gather(
    x: Any,
    *,
    axis: int,
    mode: str,
    groups: Groups,
    meta: tuple[int, ...] = (),
    impl: str = "native",
) -> Any:
    stacked = _members(x, groups) if _group_size(groups) > 1 else x[None]
    if mode == "new_axis":
        return stacked
    if mode == "meta_shape":
        flat = stacked.reshape(-1)
        return flat[: math.prod(meta)].reshape(meta)
    parts = stacked.reshape(stacked.shape[0], *(x.shape or (1,)))
    return jnp.concatenate(list(parts), axis=axis)


ALL_GATHER = define(
    "replicated_all_gather",
    "ReplicatedAllGather",
    _all_gather_infer,
    _all_gather,
    effect=True,
    grad="collective",
    special="collective",
)


def replicated_all_gather(
    t: Tensor,
    axis: int = 0,
    group: ReplicaGrouping | None = None,
    output_shape: OutputShape = "auto",
) -> Tensor:
    """Gather ``t`` from the replicas of each group, in rank order.

    ``output_shape``: ``new_axis`` stacks on a new leading axis; ``concat`` joins along
    ``axis``; ``meta_shape`` (for replica-sharded tensors) returns the full tensor of shape
    ``t.meta_shape``; ``auto`` is ``meta_shape`` when ``t`` has a meta-shape, else ``concat``.
    The gradient is ``replicated_slice`` (each replica keeps its own part; no reduction).

    A ``ReplicaGrouping`` in ``axis``'s place (``replicated_all_gather(t, grouping)``, as the
    PopXL user guide's distributed RTS example writes it) is taken as ``group``.
    """
    given: Any = axis
    if isinstance(given, ReplicaGrouping) and group is None:
        group, axis = given, 0
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise ValueError(f"axis must be an int, got {axis!r}.")
    if output_shape not in ("new_axis", "concat", "meta_shape", "auto"):
        raise ValueError(
            f"output_shape must be 'new_axis', 'concat', 'meta_shape' or 'auto', got {output_shape!r}."
        )
    mode = output_shape if output_shape != "auto" else ("meta_shape" if t.meta_shape else "concat")
    if mode == "meta_shape" and not t.meta_shape:
        raise ValueError(
            f"output_shape='meta_shape' needs a tensor with a meta-shape; {t.id} has none."
        )
    ax = normalize_axis(axis, max(t.rank, 1)) if mode == "concat" else axis
    attrs = {"axis": ax, "mode": mode, "groups": _groups(group), "meta": t.meta_shape}
    return record(ALL_GATHER, {"t": t}, attrs, [f"{t.name}_all_gathered"])[0]


def _slice_infer(t: Any, *, axis: int, groups: Groups) -> list:
    size = _group_size(groups)
    part = t.shape[axis] // size
    shape = t.shape[:axis] + ((part,) if part != 1 else ()) + t.shape[axis + 1 :]
    return [spec(shape, t.dtype)]


def _replicated_slice(x: Any, *, axis: int, groups: Groups, impl: str = "native") -> Any:
    size = _group_size(groups)
    part = x.shape[axis] // size
    rank = _rank(groups) if size > 1 else 0
    out = lax.dynamic_slice_in_dim(x, rank * part, part, axis)
    return out.squeeze(axis) if part == 1 else out


SLICE = define(
    "replicated_slice",
    "ReplicatedSlice",
    _slice_infer,
    _replicated_slice,
    effect=True,
    grad="collective",
    special="collective",
)


def replicated_slice(t: Tensor, axis: int = 0, group: ReplicaGrouping | None = None) -> Tensor:
    """Each replica takes the rank-th equal part of ``t`` along ``axis`` (the axis is dropped
    when the part has length 1). The gradient is ``replicated_all_gather``.

    Raises:
        ValueError: ``t.shape[axis]`` is not divisible by the group size.
    """
    groups = _groups(group)
    if t.rank == 0:
        raise ValueError(f"replicated_slice needs a tensor of rank >= 1; {t.id} is a scalar.")
    ax = normalize_axis(axis, t.rank)
    if t.shape[ax] % _group_size(groups):
        raise ValueError(
            f"replicated_slice: axis {ax} of {t.id} has size {t.shape[ax]}, which is not "
            f"divisible by the group size {_group_size(groups)}."
        )
    return record(SLICE, {"t": t}, {"axis": ax, "groups": groups}, [f"{t.name}_replicated_slice"])[
        0
    ]


# reduce-scatter / sharded slice ------------------------------------------------------------


def _shard_infer(t: Any, *, groups: Groups, rts: bool, **_: Any) -> list:
    size = _group_size(groups)
    n = math.prod(t.shape)
    return [spec((-(-n // size),), t.dtype, t.shape if rts else ())]


def _reduce_scatter(x: Any, *, op: str, groups: Groups, rts: bool, impl: str = "native") -> Any:
    flat = _flat_padded(x, _group_size(groups))
    return _my_chunk(_all_reduce(flat, op=op, groups=groups, impl=impl), groups)


def _sharded_slice(x: Any, *, groups: Groups, rts: bool, impl: str = "native") -> Any:
    return _my_chunk(_flat_padded(x, _group_size(groups)), groups)


REDUCE_SCATTER = define(
    "replicated_reduce_scatter",
    "ReplicatedReduceScatter",
    _shard_infer,
    _reduce_scatter,
    effect=True,
    special="collective",
)
SHARDED_SLICE = define(
    "replica_sharded_slice",
    "ReplicaShardedSlice",
    _shard_infer,
    _sharded_slice,
    effect=True,
    special="collective",
)


def replicated_reduce_scatter(
    t: Tensor,
    op: CollectiveOps = "add",
    group: ReplicaGrouping | None = None,
    configure_output_for_replicated_tensor_sharding: bool = False,
) -> Tensor:
    """Reduce ``t`` over each group and give replica of rank ``r`` the r-th chunk.

    ``t`` is flattened and zero-padded to a multiple of the group size, so the result is
    1-D of length ``ceil(nelms / group_size)``. With
    ``configure_output_for_replicated_tensor_sharding`` it is a replica-sharded tensor
    (``meta_shape = t.shape``).
    """
    attrs = {
        "op": _check_op(op),
        "groups": _groups(group),
        "rts": bool(configure_output_for_replicated_tensor_sharding),
    }
    return record(REDUCE_SCATTER, {"t": t}, attrs, [f"{t.name}_reduce_scattered"])[0]


def replica_sharded_slice(t: Tensor, group: ReplicaGrouping | None = None) -> Tensor:
    """Each replica takes its rank's chunk of its own flattened, zero-padded ``t`` (no
    reduction); the result is a replica-sharded tensor with ``meta_shape = t.shape``."""
    attrs = {"groups": _groups(group), "rts": True}
    return record(SHARDED_SLICE, {"t": t}, attrs, [f"{t.name}_sharded_slice"])[0]


# all_reduce across IPUs of one replica ----------------------------------------------------


def _list_infer(*specs: Any, **_: Any) -> list:
    same_dtype("AllReduce", *specs)
    return list(specs)


def _sum_list(*xs: Any, op: str) -> tuple:
    total = _fold(list(xs), op).astype(xs[0].dtype)
    return tuple(total for _ in xs)


IPU_ALL_REDUCE = define("all_reduce", "AllReduce", _list_infer, _sum_list)
IPU_IDENTICAL_INPUTS = define(
    "all_reduce_identical_inputs",
    "AllReduceIdenticalInputs",
    _list_infer,
    lambda *xs, op: tuple(xs),
    grad="collective",
)
IPU_IDENTICAL_GRADS = define(
    "all_reduce_identical_grad_inputs",
    "AllReduceIdenticalGradInputs",
    _list_infer,
    _sum_list,
    grad="collective",
)


def _ipu_list(
    ts: Iterable[Tensor], ipus: list[int] | None, op: str
) -> tuple[list[Tensor], list[int]]:
    tensors = list(ts)
    if ipus is None:
        try:
            ipus = [t.ipu for t in tensors]
        except Exception:
            raise ValueError(
                "Could not infer the IPUs of the tensors passed to all_reduce. Pass `ipus`."
            ) from None
    if len(tensors) != len(ipus):
        raise ValueError(f"all_reduce got {len(tensors)} tensors but {len(ipus)} ipus.")
    _check_op(op)
    return tensors, list(ipus)


def _record_ipu_reduce(
    opdef: Any, ts: Iterable[Tensor], ipus: list[int] | None, op: str
) -> list[Tensor]:
    tensors, ipus = _ipu_list(ts, ipus, op)
    inputs = {f"t{i}": t for i, t in enumerate(tensors)}
    names = [f"all_reduce_out_{i}" for i in range(len(tensors))]
    return record(opdef, inputs, {"op": op}, names, check_placement=False)


def all_reduce(
    ts: list[Tensor], ipus: list[int] | None = None, op: CollectiveOps = "add"
) -> list[Tensor]:
    """Reduce tensors living on different IPUs of one replica; one result per IPU."""
    return _record_ipu_reduce(IPU_ALL_REDUCE, ts, ipus, op)


def all_reduce_identical_inputs(
    ts: list[Tensor], ipus: list[int] | None = None, op: CollectiveOps = "add"
) -> list[Tensor]:
    """Forward: identity (the inputs are known to be equal). Backward: all-reduce."""
    return _record_ipu_reduce(IPU_IDENTICAL_INPUTS, ts, ipus, op)


def all_reduce_identical_grad_inputs(
    ts: list[Tensor], ipus: list[int] | None = None, op: CollectiveOps = "add"
) -> list[Tensor]:
    """Forward: all-reduce. Backward: identity (the gradients are known to be equal)."""
    return _record_ipu_reduce(IPU_IDENTICAL_GRADS, ts, ipus, op)


__all__ = [
    "all_reduce",
    "all_reduce_identical_inputs",
    "all_reduce_identical_grad_inputs",
    "CommGroup",
    "CommGroupType",
    "replicated_all_gather",
    "replicated_all_reduce",
    "replicated_all_reduce_",
    "replicated_reduce_scatter",
    "replica_sharded_slice",
    "replicated_slice",
]
