"""Small, checked edits of a graph's op list, for IR passes (``patterns``).

Every edit keeps the bookkeeping that ``Graph.verify()`` checks: op order, each tensor's
producer and consumers, and the graph's tensor table. Gradient ops need no rewiring: their
recipes are snapshots of the forward ops (``VjpRecipe.capture``), so forward graphs may be
edited after autodiff.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import popxl
from popxl._op import REGISTRY, Op
from popxl.errors import InternalError


def replace_op_kind(op: Op, key: str, inputs: tuple[popxl.Tensor, ...], **attrs: Any) -> None:
    """Turn ``op`` into an op of registry kind ``key`` reading ``inputs``; its outputs (ids,
    names, consumers) stay. The new kind must infer the same output specs."""
    opdef = REGISTRY[key]
    specs = opdef.infer(*(t._spec for t in inputs), **attrs)
    old = [(t.shape, t.dtype) for t in op.outputs]
    if [(tuple(s.shape), s.dtype) for s in specs] != old:
        raise InternalError(
            f"rewriting as {opdef.type} would change its outputs {old}", op, op.graph
        )
    for t in op.inputs:
        t._consumers.remove(op)
    op.opdef = opdef
    op.inputs = inputs
    op.attrs = dict(attrs)
    for t in inputs:
        t._consumers.append(op)


def replace_uses(graph: popxl.Graph, old: popxl.Tensor, new: popxl.Tensor) -> None:
    """Make every reader of ``old`` in ``graph`` (ops and graph outputs) read ``new``."""
    for consumer in list(old._consumers):
        consumer.inputs = tuple(new if t is old else t for t in consumer.inputs)
        old._consumers.remove(consumer)
        new._consumers.append(consumer)
    graph._outputs = [new if t is old else t for t in graph._outputs]


def remove_op(graph: popxl.Graph, op: Op) -> None:
    """Delete ``op``, whose outputs must have no readers left."""
    for t in op.outputs:
        if t._consumers or t in graph._outputs:
            raise InternalError(f"cannot remove it: its output {t.id} is still read", op, graph)
    for t in op.inputs:
        t._consumers.remove(op)
    for t in op.outputs:
        del graph._tensors[t.id]
    graph._ops.remove(op)


@contextmanager
def insert_before(op: Op) -> Iterator[None]:
    """Ops created in the block go into ``op``'s graph just before ``op`` (same IPU)."""
    graph = op.graph
    start = len(graph._ops)
    with graph, popxl.ipu(op.ipu):
        yield
    new_ops = graph._ops[start:]
    del graph._ops[start:]
    index = graph._ops.index(op)
    graph._ops[index:index] = new_ops


def alias_classes(graph: popxl.Graph) -> Callable[[popxl.Tensor], popxl.Tensor]:
    """``find(t)``: a representative of the tensors sharing ``t``'s storage (views and
    in-place aliases), for union-find queries."""
    parent: dict[popxl.Tensor, popxl.Tensor] = {}

    def find(t: popxl.Tensor) -> popxl.Tensor:
        while parent.get(t, t) is not t:
            t = parent[t]
        return t

    def union(a: popxl.Tensor, b: popxl.Tensor) -> None:
        parent[find(a)] = find(b)

    for op in graph._ops:
        if op.opdef.view_inverse is not None:
            for i in op.inputs:
                for o in op.outputs:
                    union(o, i)
        for out_index, in_index in op.opdef.alias_outputs:
            union(op.outputs[out_index], op.inputs[in_index])
    return find


def modified_storages(
    graph: popxl.Graph,
) -> tuple[Callable[[popxl.Tensor], popxl.Tensor], set[popxl.Tensor]]:
    """``(find, written)``: the alias-class lookup of ``graph`` and the representatives of
    the storages some op of it writes (in-place ops, by-ref call inputs)."""
    find = alias_classes(graph)
    written = {find(op.inputs[i]) for op in graph._ops for i in op.modified_input_indices()}
    return find, written
