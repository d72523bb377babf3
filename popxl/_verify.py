"""``Graph.verify``: the IR's invariants, checked by tests after building and transforms.

A graph is well formed when every tensor it uses is its own, every op input is defined
before the op (graph inputs, variables, constants and stream handles are defined from the
start), each output is recorded with its producer, recorded output specs agree with the
op's inference, in-place indices are in range, and called graphs are subgraphs of the
same Ir. Called graphs are verified too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .tensor import Constant, Tensor, Variable

if TYPE_CHECKING:
    from ._op import Op
    from .graph import Graph


def _fail(graph: Graph, message: str) -> None:
    raise AssertionError(f"{graph!r}: {message}")


def _is_source(graph: Graph, t: Tensor) -> bool:
    """Tensors defined before any op runs."""
    return (
        t in graph._inputs
        or isinstance(t, (Variable, Constant))
        or getattr(t, "_stream", None) is not None
    )


def _check_tensors(graph: Graph) -> None:
    for tid, t in graph._tensors.items():
        if t.id != tid or t._graph is not graph:
            _fail(graph, f"tensor {t.id} is registered as {tid!r} but belongs to {t._graph!r}")
        if t._producer is None and not _is_source(graph, t):
            _fail(graph, f"tensor {t.id} has no producer and is not an input, variable or constant")
    for kind, tensors in (("input", graph._inputs), ("output", graph._outputs)):
        for t in tensors:
            if graph._tensors.get(t.id) is not t:
                _fail(graph, f"{kind} {t.id} is not a tensor of this graph")
    for t in graph._by_ref_inputs:
        if t not in graph._inputs:
            _fail(graph, f"by-reference tensor {t.id} is not an input")


def _check_inference(graph: Graph, op: Op) -> None:
    if op.opdef.special is not None:
        return
    specs = op.opdef.infer(*(t._spec for t in op.inputs), **op.attrs)
    if len(specs) != len(op.outputs):
        _fail(graph, f"{op} infers {len(specs)} outputs but records {len(op.outputs)}")
    for s, t in zip(specs, op.outputs):
        if tuple(s.shape) != t.shape or s.dtype is not t.dtype:
            _fail(
                graph,
                f"{op} output {t.id} is {t.dtype.name}{t.shape}, inference says {s.dtype.name}{tuple(s.shape)}",
            )


def _check_op(graph: Graph, op: Op, defined: set[Tensor]) -> None:
    if op.graph is not graph:
        _fail(graph, f"{op} is recorded in {op.graph!r}")
    for t in op.inputs:
        if t._graph is not graph:
            _fail(graph, f"{op} reads {t.id} of {t._graph!r}")
        if t not in defined:
            _fail(graph, f"{op} reads {t.id} before it is produced")
        if op not in t._consumers:
            _fail(graph, f"{op} is missing from the consumers of {t.id}")
    n_in = len(op.inputs)
    for index in op.modified_input_indices():
        if not 0 <= index < n_in:
            _fail(graph, f"{op} modifies input {index} but has {n_in} inputs")
    for out_index, in_index in op.opdef.alias_outputs:
        if not (0 <= out_index < len(op.outputs) and 0 <= in_index < n_in):
            _fail(graph, f"{op} aliases output {out_index} to input {in_index}, out of range")
    for t in op.outputs:
        if t._producer is not op or graph._tensors.get(t.id) is not t:
            _fail(graph, f"output {t.id} of {op} is not recorded with its producer")
        defined.add(t)
    for called in op.called_graphs:
        if called.ir is not graph.ir or called is graph or called is graph.ir.main_graph:
            _fail(graph, f"{op} calls {called!r}, which is not a subgraph of this Ir")
    _check_inference(graph, op)


def verify_graph(graph: Graph, _seen: set[Graph] | None = None) -> None:
    """Check ``graph`` and the graphs it calls; raises ``AssertionError`` naming the problem."""
    seen = set() if _seen is None else _seen
    if graph in seen:
        return
    seen.add(graph)
    _check_tensors(graph)
    defined = {t for t in graph._tensors.values() if _is_source(graph, t)}
    for op in graph._ops:
        _check_op(graph, op, defined)
    for called in graph.called_graphs:
        verify_graph(called, seen)


__all__ = ["verify_graph"]
