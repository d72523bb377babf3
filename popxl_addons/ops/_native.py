"""Shared pieces of popxl-addons' custom ops, which are ordinary registry ops here.

The original compiled each custom op from C++ for the IPU. Here each is one ``OpDef``
(``popxl._op``) with a JAX lowering; this module holds what several of them share:

* ``replica_op``: declare an op whose lowering talks to the other replicas. The runtime
  lowers it like ``popxl.ops.collectives`` (``special="collective"``), passing ``impl``.
* replica groups and the collectives usable inside lowerings (``all_reduce``, ``rank``...),
  the same ones ``popxl.ops.collectives`` lowers to, so vmap and shard_map both work.
* ``define_all_reduce_pair``: the all-reduce whose gradient is itself an all-reduce with
  ``identical_inputs`` and ``identical_grad_inputs`` swapped (tensor parallelism).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from popxl import ReplicaGrouping, Tensor
from popxl._op import Op, OpDef, core_error, define
from popxl.ops import collectives as _coll
from popxl.ops._base import jax, jnp, lax, record
from popxl.transforms.autodiff import register_adjoint

Groups = _coll.Groups


def replica_op(key: str, type_: str, infer: Any, lower: Any, **kw: Any) -> OpDef:
    """Declare an op whose lowering ``lower(*arrays, impl=..., **attrs)`` may use the
    collectives below (it runs on every replica, like a collective)."""
    return define(key, type_, infer, lower, special="collective", **kw)


def groups_of(group: ReplicaGrouping | None) -> Groups:
    """The hashable group table of ``group`` (default: all replicas of the current IR)."""
    return _coll._groups(group)


def group_size(groups: Groups) -> int:
    return _coll._group_size(groups)


def all_reduce(x: Any, op: str, groups: Groups, impl: str) -> Any:
    """Reduce ``x`` over this replica's group (inside a lowering)."""
    return _coll._all_reduce(x, op=op, groups=groups, impl=impl)


def all_gather_flat(x: Any, groups: Groups) -> Any:
    """``(group_size * x.size,)``: the group members' flattened ``x``, in rank order."""
    if group_size(groups) == 1:
        return x.reshape(-1)
    return _coll._members(x, groups).reshape(-1)


def reduce_scatter_flat(x: Any, op: str, groups: Groups, impl: str) -> Any:
    """This replica's chunk of the flattened, zero-padded, group-reduced ``x``."""
    return _coll._reduce_scatter(x, op=op, groups=groups, rts=False, impl=impl)


def same_spec(t: Any, **_: Any) -> list:
    return [t]


def float32(x: Any) -> Any:
    """Compute in float32 at least (float16 inputs), keep wider types."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def rounded(product: Any) -> Any:
    """``product``, rounded on its own before it is summed: XLA:CPU would otherwise fuse a
    multiply and an add into one FMA (one rounding), so results would differ in the last
    bit from the original (and from PyTorch). The select on NaN (which changes nothing)
    is what stops the fusion; an ``optimization_barrier`` does not."""
    return jnp.where(jnp.isnan(product), jnp.nan, product)


# The all-reduce pairs of tensor parallelism -----------------------------------------------

REDUCTION_ONLY_MSG = (
    "Cannot create {type} op. {allowed} {verb} the only collective operator{s} that {verb2} "
    "currently implemented (got {op!r})."
)


# Keys of the all-reduce pair ops (``OpToIdentityPattern`` rewrites their identity form).
ALL_REDUCE_PAIRS: set[str] = set()

NEED_PATTERN_MSG = (
    "You need to run the `OpToIdentityPattern` pattern before running the IR: a {type} op "
    "with identical_inputs=True is still in the IR (the forward of "
    "{identical_inputs}, or the gradient of {identical_grad_inputs}). It becomes the identity "
    "it stands for only when popxl_addons.patterns.apply_pre_alias_patterns(ir) rewrites "
    "it; call that after autodiff and before creating the Session."
)


def _need_pattern(type_: str, public: str) -> Any:
    """The lowering of an all-reduce pair's identity form, which the original refused to
    compile (its Opx raised): only ``OpToIdentityPattern`` turned it into an identity."""

    def lower(
        x: Any, *, op: str, groups: Groups, identical_inputs: bool, impl: str, **_: Any
    ) -> Any:
        if identical_inputs:
            raise core_error(
                NEED_PATTERN_MSG.format(
                    type=type_,
                    identical_inputs=f"{public}_identical_inputs",
                    identical_grad_inputs=f"{public}_identical_grad_inputs",
                )
            )
        return all_reduce(x, op, groups, impl)

    return lower


def _swapped_adjoint(op: Op, cotangents: list[Tensor]) -> Sequence[Tensor | None]:
    """The gradient of an all-reduce pair is the same op with the flags swapped."""
    attrs = dict(op.attrs)
    attrs["identical_inputs"], attrs["identical_grad_inputs"] = (
        op.attrs["identical_grad_inputs"],
        op.attrs["identical_inputs"],
    )
    (cot,) = cotangents
    return record(op.opdef, {"t": cot}, attrs, [f"{cot.name}_{op.opdef.key}"])


def define_all_reduce_pair(key: str, type_: str, public: str) -> OpDef:
    """An all-reduce that is an identity when ``identical_inputs`` (its inputs are known to
    be equal on the group's replicas); its gradient is the same op with
    ``identical_inputs``/``identical_grad_inputs`` swapped. As in the original, the identity
    form must be rewritten by ``OpToIdentityPattern`` before a session compiles it
    (``public`` is the name its user-facing functions start with, for the error)."""
    opdef = replica_op(key, type_, same_spec, _need_pattern(type_, public), grad="adjoint")
    ALL_REDUCE_PAIRS.add(key)
    register_adjoint(key, _swapped_adjoint)
    return opdef


def check_reduction(opdef: OpDef, op: str, allowed: tuple[str, ...]) -> None:
    """Raise, as the original did, unless ``op`` is one of the reductions it implemented."""
    if op in allowed:
        return
    names = " and ".join(f"CollectiveOperator::{a.capitalize()}" for a in allowed)
    many = len(allowed) > 1
    raise core_error(
        REDUCTION_ONLY_MSG.format(
            type=opdef.type + "Op",
            allowed=names,
            verb="are" if many else "is",
            s="s" if many else "",
            verb2="are" if many else "is",
            op=op,
        )
    )


def record_all_reduce_pair(
    opdef: OpDef,
    t: Tensor,
    op: str,
    group: ReplicaGrouping | None,
    allowed: tuple[str, ...],
    identical_inputs: bool,
    identical_grad_inputs: bool,
    name: str,
) -> Tensor:
    """Check ``op`` against the reductions the original implemented and record the op."""
    check_reduction(opdef, op, allowed)
    attrs = {
        "op": op,
        "groups": groups_of(group),
        "identical_inputs": bool(identical_inputs),
        "identical_grad_inputs": bool(identical_grad_inputs),
    }
    return record(opdef, {"t": t}, attrs, [name])[0]


__all__ = [
    "all_gather_flat",
    "all_reduce",
    "check_reduction",
    "core_error",
    "define",
    "define_all_reduce_pair",
    "float32",
    "group_size",
    "groups_of",
    "jax",
    "jnp",
    "lax",
    "record",
    "record_all_reduce_pair",
    "reduce_scatter_flat",
    "replica_op",
    "rounded",
    "same_spec",
]
