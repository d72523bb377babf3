"""Storage analysis of a forward graph for autodiff.

Tensors are handles on storage. An op output that is neither a view nor an in-place alias
owns new storage: a *root*. In-place ops write new *versions* of a root; views read their
roots. Autodiff works on root versions, so in-place updates of intermediates and writes
through views are differentiated correctly: every op is a function from the versions it
reads to the versions it writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._op import Op
from ..graph import Graph
from ..tensor import Tensor


def parents(h: Tensor) -> tuple[Tensor, ...] | None:
    """The handles ``h`` is a view of (an in-place alias counts as an identity view), or None
    when ``h`` owns its storage."""
    op = h._producer
    if op is None:
        return None
    if op.opdef.view_inverse is not None:
        return op.inputs
    k = op.outputs.index(h)
    for out_index, in_index in op.opdef.alias_outputs:
        if out_index == k:
            return (op.inputs[in_index],)
    return None


def roots(h: Tensor) -> tuple[Tensor, ...]:
    """The root storages ``h`` reads, in first-seen order."""
    ps = parents(h)
    if ps is None:
        return (h,)
    seen: dict[Tensor, None] = {}
    for p in ps:
        for r in roots(p):
            seen[r] = None
    return tuple(seen)


def is_identity_alias(h: Tensor) -> bool:
    """True when ``h`` reads exactly one root without reshaping it (in-place op outputs)."""
    ps = parents(h)
    if ps is None:
        return True
    op = h._producer
    return op is not None and op.opdef.view_inverse is None and is_identity_alias(ps[0])


def written_inputs(op: Op) -> list[int]:
    """Input indices whose storage ``op`` writes."""
    return sorted({i for i, _ in op.opdef.modifies} | op.modified_inputs)


@dataclass(eq=False)
class Version:
    """The value of a root between two writes."""

    root: Tensor
    index: int
    overwritten_by: Op | None = None

    def __repr__(self) -> str:
        return f"Version({self.root.id}#{self.index})"


@dataclass(eq=False)
class Step:
    """One non-view op as a function of root versions."""

    op: Op
    befores: list[Version]
    written: list[Version]
    new_outputs: list[Version]

    @property
    def results(self) -> list[Version]:
        """The versions this op produces, in the order its gradient rule receives cotangents."""
        return self.written + self.new_outputs


@dataclass
class Analysis:
    steps: list[Step] = field(default_factory=list)
    current: dict[Tensor, Version] = field(default_factory=dict)
    handle_version: dict[Tensor, Version] = field(default_factory=dict)

    def version(self, root: Tensor) -> Version:
        v = self.current.get(root)
        if v is None:
            v = self.current[root] = Version(root, 0)
        return v

    def is_final(self, v: Version) -> bool:
        return self.current.get(v.root) is v


def analyse(graph: Graph) -> Analysis:
    """Walk ``graph`` in order, recording which root versions each op reads and writes."""
    a = Analysis()
    for t in graph._inputs:
        a.handle_version[t] = a.version(t)
    for op in graph._ops:
        if op.opdef.view_inverse is not None:
            continue
        read = [r for h in op.inputs for r in roots(h)]
        writes = [r for i in written_inputs(op) for r in roots(op.inputs[i])]
        befores = [a.version(r) for r in dict.fromkeys(read + writes)]
        written = []
        for r in dict.fromkeys(writes):
            old = a.current[r]
            old.overwritten_by = op
            new = a.current[r] = Version(r, old.index + 1)
            written.append(new)
        new_outputs = []
        for out in op.outputs:
            if parents(out) is None:
                new_outputs.append(a.version(out))
                a.handle_version[out] = a.current[out]
            elif is_identity_alias(out):
                a.handle_version[out] = a.current[roots(out)[0]]
        a.steps.append(Step(op, befores, written, new_outputs))
    return a


def modifies_graph_input(graph: Graph) -> Op | None:
    """The first op that writes the storage of one of ``graph``'s inputs, if any."""
    inputs = set(graph._inputs)
    for op in graph._ops:
        for i in written_inputs(op):
            if any(r in inputs for r in roots(op.inputs[i])):
                return op
    return None


def move_before(graph: Graph, op: Op, anchor: Op | None) -> None:
    """Move the just-added ``op`` so it runs right before ``anchor`` (end if None)."""
    if anchor is None:
        return
    graph._ops.remove(op)
    graph._ops.insert(graph._ops.index(anchor), op)
