"""Gradient op kinds: one per forward op kind, lowered as ``jax.vjp`` of the forward op."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._op import Op, OpDef
from ..tensor import Tensor
from ._storage import parents

_GRAD_OPDEFS: dict[str, OpDef] = {}


def _no_infer(*_: Any, **__: Any) -> list:
    raise AssertionError("gradient ops are created with explicit output specs")


def grad_opdef(forward: OpDef) -> OpDef:
    """The gradient op kind of ``forward`` (printed as ``<Type>Grad``)."""
    opdef = _GRAD_OPDEFS.get(forward.key)
    if opdef is None:
        opdef = OpDef(
            f"{forward.key}__grad", f"{forward.type}Grad", _no_infer, special="vjp", grad="none"
        )
        _GRAD_OPDEFS[forward.key] = opdef
    return opdef


@dataclass(frozen=True, eq=False)
class VjpRecipe:
    """What a gradient op differentiates.

    Attributes:
        op: the forward op.
        roots: the root storages the forward op reads or writes (their values before it).
        needs_values: whether the gradient op takes those values as inputs (else zeros of
            the right shape stand in, for linear ops).
        present: for each forward result (written roots, then new outputs), whether a
            cotangent input is connected.
        grad_for: indices into ``roots`` that the gradient op outputs gradients for.
    """

    op: Op
    roots: tuple[Tensor, ...]
    needs_values: bool
    present: tuple[bool, ...]
    grad_for: tuple[int, ...]

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
            self.needs_values,
            self.present,
            self.grad_for,
        )

    def _chain(self, h: Tensor, attr_key: Callable[[Any], Any]) -> Any:
        if h in self.roots:
            return ("root", self.roots.index(h))
        op = h._producer
        assert op is not None
        attrs = tuple(sorted((k, attr_key(v)) for k, v in op.attrs.items()))
        return (
            op.opdef.key,
            attrs,
            op.outputs.index(h),
            tuple(self._chain(p, attr_key) for p in parents(h) or ()),
        )
