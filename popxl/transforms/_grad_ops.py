"""Gradient op kinds: one per forward op kind, lowered as ``jax.vjp`` of the forward op."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._op import Op, OpDef
from ..errors import InternalError
from ..tensor import Tensor
from ._storage import parents

_GRAD_OPDEFS: dict[str, OpDef] = {}


def _no_infer(*_: Any, **__: Any) -> list:
    raise InternalError("gradient ops are created with explicit output specs")


def grad_opdef(forward: OpDef) -> OpDef:
    """The gradient op kind of ``forward`` (printed as ``<Type>Grad``)."""
    opdef = _GRAD_OPDEFS.get(forward.key)
    if opdef is None:
        opdef = OpDef(
            f"{forward.key}__grad", f"{forward.type}Grad", _no_infer, special="vjp", grad="none"
        )
        _GRAD_OPDEFS[forward.key] = opdef
    return opdef


_OUTPUT_GRAD_OPDEFS: dict[str, OpDef] = {}
# gradient op kind key -> the forward op kind whose ``grad_from_output`` it runs
OUTPUT_GRAD_FORWARD: dict[str, OpDef] = {}


def output_grad_opdef(forward: OpDef) -> OpDef:
    """The gradient op kind of ``forward`` computed from its output (``grad_from_output``):
    inputs ``(y, dy)``, the forward op's attributes, printed as ``<Type>Grad``."""
    opdef = _OUTPUT_GRAD_OPDEFS.get(forward.key)
    if opdef is None:
        opdef = OpDef(
            f"{forward.key}__grad_from_output",
            f"{forward.type}Grad",
            _no_infer,
            special="vjp_output",
            grad="none",
        )
        _OUTPUT_GRAD_OPDEFS[forward.key] = opdef
        OUTPUT_GRAD_FORWARD[opdef.key] = forward
    return opdef


@dataclass(frozen=True, eq=False)
class VjpRecipe:
    """What a gradient op differentiates: a private snapshot of the forward op.

    ``capture`` copies the forward op and the views between it and its roots into handles
    that no graph owns, so the gradient op keeps computing the function it was built for
    when the forward graph is edited later (patterns, ``replace_uses``, op removal, ops
    moved into other graphs). Nothing outside the recipe refers to its handles.

    Attributes:
        op: the snapshot of the forward op (same id, kind, attributes and placement).
        roots: the snapshots of the root storages the forward op reads or writes (their
            values before it), in the gradient op's input order.
        needed: for each root, whether the gradient op takes its value as an input (else
            zeros of the right shape stand in: linear ops need no values, and the gradient
            of one operand of a product needs only the other's).
        present: for each forward result (written roots, then new outputs), whether a
            cotangent input is connected.
        grad_for: indices into ``roots`` that the gradient op outputs gradients for.
        detached: the forward op has no gradient (a variable update, host or remote IO)
            but writes a view of a larger storage: the recipe writes a constant through
            that view instead of running the op, so the gradient op passes on the gradient
            of the parts of the storage the op leaves alone.
    """

    op: Op
    roots: tuple[Tensor, ...]
    needed: tuple[bool, ...]
    present: tuple[bool, ...]
    grad_for: tuple[int, ...]
    detached: bool = False

    @classmethod
    def capture(
        cls,
        op: Op,
        roots: tuple[Tensor, ...],
        needed: tuple[bool, ...],
        present: tuple[bool, ...],
        grad_for: tuple[int, ...],
        detached: bool = False,
    ) -> VjpRecipe:
        """The recipe of ``op`` over ``roots``, snapshotted (see the class docstring)."""
        copies: dict[Tensor, Tensor] = {r: _detached(r, None) for r in roots}
        forward = _detached_op(op, tuple(_copy_handle(h, copies) for h in op.inputs))
        snapshot = tuple(copies[r] for r in roots)
        return cls(forward, snapshot, needed, present, grad_for, detached)

    @property
    def values(self) -> tuple[Tensor, ...]:
        """The roots whose values the gradient op takes as inputs, in its input order."""
        return tuple(r for r, need in zip(self.roots, self.needed) if need)

    @property
    def results(self) -> tuple[Tensor, ...]:
        """Written roots, then the outputs that own new storage, in cotangent order."""
        from ._storage import roots, written_inputs  # noqa: PLC0415

        written = dict.fromkeys(
            r for i in written_inputs(self.op) for r in roots(self.op.inputs[i])
        )
        fresh = tuple(o for o in self.op.outputs if parents(o) is None)
        return tuple(written) + fresh

    def structural_key(self, attr_key: Callable[[Any], Any]) -> tuple:
        op = self.op
        attrs = tuple(sorted((k, attr_key(v)) for k, v in op.attrs.items()))
        inputs = tuple(self._chain(h, attr_key) for h in op.inputs)
        results = tuple(
            ("root", self.roots.index(r)) if r in self.roots else ("out", op.outputs.index(r))
            for r in self.results
        )
        specs = tuple((r.shape, r.dtype.name) for r in self.roots)
        return (
            op.opdef.key,
            attrs,
            inputs,
            results,
            specs,
            self.needed,
            self.present,
            self.grad_for,
            self.detached,
        )

    def _chain(self, h: Tensor, attr_key: Callable[[Any], Any]) -> Any:
        if h in self.roots:
            return ("root", self.roots.index(h))
        op = h._producer
        if op is None:
            raise InternalError(f"{h.id} is neither a root nor a view", op=self.op)
        attrs = tuple(sorted((k, attr_key(v)) for k, v in op.attrs.items()))
        return (
            op.opdef.key,
            attrs,
            op.outputs.index(h),
            tuple(self._chain(p, attr_key) for p in parents(h) or ()),
        )


def _detached(t: Tensor, producer: Op | None) -> Tensor:
    """A handle with ``t``'s id and spec that no graph owns."""
    h = object.__new__(Tensor)
    h._graph, h._id, h._spec, h._producer = t._graph, t._id, t._spec, producer
    h._consumers = []
    h._stream = None
    return h


def _detached_op(op: Op, inputs: tuple[Tensor, ...]) -> Op:
    """A copy of ``op`` on ``inputs`` that no graph lists, with its own output handles."""
    copy = Op(
        op.opdef,
        op.attrs,
        inputs,
        op.graph,
        op.id,
        op.ipu,
        op.tile_set,
        op.scope,
        op.location,
        op.execution_context,
    )
    copy.modified_inputs = set(op.modified_inputs)
    copy.outputs = tuple(_detached(t, copy) for t in op.outputs)
    return copy


def _copy_handle(h: Tensor, copies: dict[Tensor, Tensor]) -> Tensor:
    """The snapshot of handle ``h``: a root's copy, or a copy of the view chain above it."""
    if h in copies:
        return copies[h]
    view, ps = h._producer, parents(h)
    if view is None or ps is None:
        raise InternalError(f"{h.id} is neither a root of the recipe nor a view of one", op=view)
    # An in-place op's other operands only matter to the forward graph: opaque copies.
    inputs = tuple(_copy_handle(t, copies) if t in ps else _detached(t, None) for t in view.inputs)
    copy = _detached_op(view, inputs)
    copies.update(zip(view.outputs, copy.outputs))
    return copies[h]
