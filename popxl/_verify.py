"""``Graph.verify``: the IR's invariants, checked by tests after building and transforms.

A graph is well formed when every tensor it uses is its own, every op input is defined
before the op (graph inputs, variables, constants and stream handles are defined from the
start), each output is recorded with its producer, recorded output specs agree with the
op's inference, in-place indices are in range, and called graphs are subgraphs of the
same Ir. Called graphs are verified too.

Ops may also refer to tensors that are not their inputs or outputs: a tensor in an
attribute must still be owned by a graph of the Ir, and a gradient op's recipe must be a
self-contained snapshot (every forward input reaches a root through views, and the
gradient op's inputs and outputs match the roots). Broken invariants raise
``popxl.errors.InternalError`` naming the op and graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import InternalError
from .tensor import Constant, Tensor, Variable
from .transforms._storage import parents

if TYPE_CHECKING:
    from ._op import Op
    from .graph import Graph
    from .transforms._grad_ops import VjpRecipe

STALE_ATTR_MSG = (
    "attribute {name!r} refers to tensor {tensor}, which no graph of this Ir owns any more "
    "(it was removed or replaced after the op was built); an IR edit must rewire the "
    "attribute too"
)
STALE_RECIPE_MSG = (
    "the gradient recipe of {forward} refers to the live tensor {tensor}; recipes must be "
    "snapshots (VjpRecipe.capture) so that later edits of the forward graph cannot change them"
)


def _fail(graph: Graph, message: str, op: Op | None = None) -> None:
    raise InternalError(message, op=op, graph=graph)


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
        _fail(graph, f"infers {len(specs)} outputs but records {len(op.outputs)}", op)
    for s, t in zip(specs, op.outputs):
        if tuple(s.shape) != t.shape or s.dtype is not t.dtype:
            found, inferred = f"{t.dtype.name}{t.shape}", f"{s.dtype.name}{tuple(s.shape)}"
            _fail(graph, f"output {t.id} is {found}, inference says {inferred}", op)


def _check_op(graph: Graph, op: Op, defined: set[Tensor]) -> None:
    if op.graph is not graph:
        _fail(graph, f"it is recorded in {op.graph!r}", op)
    for t in op.inputs:
        if t._graph is not graph:
            _fail(graph, f"reads {t.id} of {t._graph!r}", op)
        if t not in defined:
            _fail(graph, f"reads {t.id} before it is produced", op)
        if op not in t._consumers:
            _fail(graph, f"it is missing from the consumers of {t.id}", op)
    n_in = len(op.inputs)
    for index in op.modified_input_indices():
        if not 0 <= index < n_in:
            _fail(graph, f"modifies input {index} but has {n_in} inputs", op)
    for out_index, in_index in op.opdef.alias_outputs:
        if not (0 <= out_index < len(op.outputs) and 0 <= in_index < n_in):
            _fail(graph, f"aliases output {out_index} to input {in_index}, out of range", op)
    for t in op.outputs:
        if t._producer is not op or graph._tensors.get(t.id) is not t:
            _fail(graph, f"its output {t.id} is not recorded with its producer", op)
        defined.add(t)
    for called in op.called_graphs:
        if called.ir is not graph.ir or called is graph or called is graph.ir.main_graph:
            _fail(graph, f"calls {called!r}, which is not a subgraph of this Ir", op)
    _check_inference(graph, op)
    _check_references(graph, op)


def _owned(t: Tensor, graph: Graph) -> bool:
    """Whether ``t`` is still a tensor of some graph of ``graph``'s Ir."""
    owner = t._graph
    return owner.ir is graph.ir and owner._tensors.get(t.id) is t


def _attr_tensors(value: object) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _attr_tensors(v)]
    return []


def _check_references(graph: Graph, op: Op) -> None:
    for name, value in op.attrs.items():
        for t in _attr_tensors(value):
            if not _owned(t, graph):
                _fail(graph, STALE_ATTR_MSG.format(name=name, tensor=t.id), op)
    recipe = op.attrs.get("recipe")
    if recipe is not None:
        _check_recipe(graph, op, recipe)


def _check_recipe(graph: Graph, op: Op, recipe: VjpRecipe) -> None:
    """The recipe is a snapshot that lowers: no live tensor in it, every forward input
    reaches a root, and the gradient op's inputs and outputs match the roots."""
    roots = set(recipe.roots)

    def reach(h: Tensor) -> None:
        if _owned(h, graph):
            _fail(graph, STALE_RECIPE_MSG.format(tensor=h.id, forward=recipe.op), op)
        if h in roots:
            return
        ps = parents(h)
        if ps is None:
            _fail(graph, f"the recipe's input {h.id} is neither a root nor a view of one", op)
        for p in ps or ():
            reach(p)

    for h in recipe.op.inputs:
        reach(h)
    values = recipe.values
    n_in = len(values) + sum(recipe.present)
    if len(op.inputs) != n_in:
        _fail(graph, f"the recipe expects {n_in} inputs, the gradient op has {len(op.inputs)}", op)
    wanted = [r._spec for r in values] + [recipe.roots[k]._spec for k in recipe.grad_for]
    for t, s in zip((*op.inputs[: len(values)], *op.outputs), wanted):
        if (t.shape, t.dtype) != (tuple(s.shape), s.dtype):
            _fail(graph, f"{t.id} is {t.dtype.name}{t.shape}, its recipe root is {s}", op)


def verify_graph(graph: Graph, _seen: set[Graph] | None = None) -> None:
    """Check ``graph`` and the graphs it calls.

    Raises:
        InternalError: a broken invariant, naming the op and graph.
    """
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
